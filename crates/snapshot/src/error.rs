//! Why a file could not be read. Every variant renders as one line that a user can act on.

use std::fmt;

#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    Empty,
    /// The pickle asked to import or call code; nothing was executed.
    Refused {
        opcode: &'static str,
        offset: u64,
        what: &'static str,
    },
    /// A well-formed pickle that uses an opcode this reader does not accept.
    Unsupported {
        what: String,
        offset: u64,
    },
    /// The pickle stream is broken (bad opcode, stack underflow, ...).
    Corrupt {
        what: String,
        offset: u64,
    },
    /// The stream ended early.
    Truncated {
        offset: u64,
    },
    /// Not a pickle, not gzip, not JSON.
    UnknownFormat {
        first_bytes: String,
        /// What to run instead, when the first bytes tell (a text with an OOM message).
        hint: Option<&'static str>,
    },
    /// A valid pickle or JSON that is not a memory snapshot (or profiler trace).
    Shape(String),
    Json(String),
    /// The input asks for more memory than any memory snapshot needs: a string longer
    /// than a snapshot holds, data that inflates past the compression ratio of real files,
    /// values that expand past the reader's budget (see [`crate::budget`]). The text names
    /// the limit.
    Limit(String),
    /// The file changed while it was read (truncated or rewritten by another process, as
    /// a job that dumps its snapshot to the same path does), or its pages became unreadable.
    Changed,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "cannot read: {e}"),
            ReadError::Empty => write!(f, "the file is empty"),
            ReadError::Refused { opcode, offset, what } => {
                write!(f, "pickle opcode {opcode} at byte {offset} would {what}; refusing")
            }
            ReadError::Unsupported { what, offset } => {
                write!(f, "{} at byte {offset} is not supported", one_line(what))
            }
            ReadError::Corrupt { what, offset } => write!(f, "corrupt pickle at byte {offset}: {}", one_line(what)),
            ReadError::Truncated { offset } => {
                write!(f, "truncated: the data ends at byte {offset} in the middle of the pickle")
            }
            ReadError::UnknownFormat { first_bytes, hint } => write!(
                f,
                "unrecognised format (starts with {first_bytes}); expected a pickle from \
                 torch.cuda.memory._dump_snapshot (optionally gzip-compressed), a torch.save file (.pt/.pth) \
                 of torch.cuda.memory_snapshot(), or a torch.profiler JSON trace{}",
                hint.map(|h| format!("; {h}")).unwrap_or_default()
            ),
            ReadError::Shape(s) => write!(f, "{}", one_line(s)),
            ReadError::Json(s) => write!(f, "invalid JSON: {}", one_line(s)),
            ReadError::Limit(s) => write!(f, "refusing: {}", one_line(s)),
            ReadError::Changed => write!(
                f,
                "the file changed while it was being read (another process truncated or rewrote it); \
                 read it again once it is complete"
            ),
        }
    }
}

/// `s` with its control characters escaped (`\n` for a newline): messages quote strings
/// from the file (a block state, a key), and a message is one line whatever the file holds.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    s.chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect::<String>()
        .into()
}

impl std::error::Error for ReadError {}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        // A limit hit inside a reader chain (the inflation guard) comes back as an
        // io::Error carrying the ReadError.
        if e.get_ref().is_some_and(|inner| inner.is::<ReadError>()) {
            return *e.into_inner().expect("checked").downcast::<ReadError>().expect("checked");
        }
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return ReadError::Truncated { offset: 0 };
        }
        ReadError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::ReadError;

    /// Found by the fuzz test: a block state string with a newline in it (one flipped
    /// byte) made a two-line message.
    #[test]
    fn messages_that_quote_the_file_are_one_line() {
        let errors = [
            ReadError::Shape("segments[1].blocks[0]: unknown block state 'active_all\ncated'".into()),
            ReadError::Corrupt { what: "bad \r\u{1b}[31m string".into(), offset: 3 },
            ReadError::Unsupported { what: "opcode \u{0}".into(), offset: 9 },
            ReadError::Json("line 1\ncolumn 2".into()),
        ];
        for e in errors {
            let m = e.to_string();
            assert!(!m.chars().any(char::is_control), "{m:?}");
        }
        let m = ReadError::Shape("state 'a\nb'".into()).to_string();
        assert_eq!(m, "state 'a\\nb'");
    }
}
