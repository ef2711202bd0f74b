use fragscope_commands::ranks::{figures_of_document, json_of_analyses, json_of_documents};
use fragscope_commands::summary::analyze_json;
use fragscope_diagnose::{analyze, AnalyzeOptions, RankFigures};

/// Python builds its rank comparison from each rank's `analyze` document; the report from
/// the analyses. Both must read the same figures, so that they compare ranks alike.
#[test]
fn a_document_gives_the_figures_its_analysis_gives() {
    let files = fragscope_testdata::real_pickles();
    assert!(files.len() >= fragscope_testdata::min_files(20), "{} files", files.len());
    let opts = AnalyzeOptions { top: 5, ..AnalyzeOptions::default() };
    let mut docs = Vec::new();
    let mut analyses = Vec::new();
    for path in files.iter().take(8) {
        let snap = fragscope_snapshot::read_path(path).expect("real file reads");
        let a = analyze(&snap, &opts);
        let name = path.display().to_string();
        let text = analyze_json(&[(name.clone(), a.clone())], &[]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(figures_of_document(&v["files"][0]).unwrap(), RankFigures::of(&a), "{name}");
        docs.push((name.clone(), Ok(text)));
        analyses.push((name, a));
    }
    docs.push(("missing.pickle".into(), Err("cannot read missing.pickle".into())));
    let refs: Vec<(String, Result<&_, String>)> = analyses
        .iter()
        .map(|(n, a)| (n.clone(), Ok(a)))
        .chain([("missing.pickle".to_string(), Err("cannot read missing.pickle".to_string()))])
        .collect();
    let (from_docs, from_analyses) = (json_of_documents(&docs).unwrap(), json_of_analyses(&refs).unwrap());
    assert_eq!(from_docs, from_analyses);
    let v: serde_json::Value = serde_json::from_str(&from_docs).unwrap();
    assert_eq!(v["schema"], "fragscope.ranks/1");
    assert_eq!(v["ranks"].as_array().unwrap().len(), docs.len());
    assert_eq!(v["ranks"][docs.len() - 1]["error"], "cannot read missing.pickle");
}

#[test]
fn a_document_that_is_not_an_analysis_makes_its_rank_unreadable() {
    let docs = vec![("a".to_string(), Ok("{\"files\": [{}]}".to_string())), ("b".to_string(), Ok("nope".to_string()))];
    let v: serde_json::Value = serde_json::from_str(&json_of_documents(&docs).unwrap()).unwrap();
    assert!(v["ranks"][0]["error"].as_str().unwrap().contains("not an analyze document"));
    assert!(v["ranks"][1]["error"].as_str().unwrap().starts_with("not JSON"));
    assert_eq!(v["peak_rank"], serde_json::Value::Null);
}
