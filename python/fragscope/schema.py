"""Types of the ``--json`` documents, for type checkers: the objects of docs/json-schema.md
as ``TypedDict``s. A result's ``to_dict()`` and its nested fields are these (at run time,
dicts whose keys also read as attributes, :class:`fragscope.Fields`).

Kept in step with docs/json-schema.md by python/tests/test_schema.py, which reads the
document's tables and compares each documented object's keys and types with the class of
the same name here, and the keys of real results with both: the stub, the document and
the output cannot drift apart unnoticed.

Objects the document describes in prose only (``pools``, ``memory_table``,
``peaks``, ...) are ``Dict[str, Any]`` here.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

__all__ = [
    "SummaryDoc",
    "FileSummary",
    "DeviceSummary",
    "Fragmentation",
    "Trace",
    "MemvizStats",
    "Settings",
    "AnalyzeDoc",
    "FileAnalysis",
    "DeviceAnalysis",
    "LeakSteps",
    "LeakSuspect",
    "Finding",
    "Recommendations",
    "LabDoc",
    "LabFile",
    "LabReport",
    "LabRow",
    "ReplayDoc",
    "DiffDoc",
    "CheckDoc",
]


# --- fragscope.summary/1 ---------------------------------------------------------------


class Fragmentation(TypedDict):
    """Free space of the final state (``_memory_viz.py stats``' internal/external split)."""

    reserved_minus_allocated_bytes: int
    free_bytes: int
    internal_free_bytes: int
    external_free_bytes: int
    internal_free_share: float
    inactive_bytes: int
    largest_free_block_bytes: int
    #: ``1 − largest_free_block_bytes / inactive_bytes``: how split up the cached free space is.
    free_space_fragmentation: float
    pinned_segments: int
    pinned_reserved_bytes: int
    pinned_free_bytes: int


class Trace(TypedDict):
    """What the device's trace holds and whether it covers the final state."""

    events: int
    by_action: Dict[str, int]
    first_time_us: Optional[int]
    last_time_us: Optional[int]
    span_us: Optional[int]
    history: str
    frees_of_unknown_blocks: int
    segment_frees_of_unknown_segments: int
    live_blocks: int
    live_bytes: int
    live_blocks_untraced: int
    live_bytes_traced: int
    live_bytes_coverage: Optional[float]
    trace_live_missing_from_state: int


class _DeviceSummaryKeys(TypedDict):

    device: int
    segments: int
    blocks: int
    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    requested_bytes: int
    inactive_split_bytes: int
    allocations: int
    active_blocks: int
    inactive_split_blocks: int
    pools: Dict[str, Any]
    expandable_segments: int
    largest_free_block_bytes: int
    trace_events: int
    fragmentation: Fragmentation
    trace: Trace


class DeviceSummary(_DeviceSummaryKeys, total=False):
    """One device's ``memory_summary()`` figures (``all`` pool, current values)."""

    #: Absent without a trace, or when trace and state disagree.
    memory_table: Dict[str, Any]
    #: Memory by role (parameters, gradients, optimizer_state, ...): ``by_role`` maps each
    #: role to ``{at_peak, max, found_at_peak, found_max, ..., cannot_tell}``
    #: (docs/json-schema.md); ``cannot_tell`` (a reason, else null) marks a total the trace
    #: cannot decide: ``at_peak``/``max`` are then null, ``found_*`` a lower bound.
    roles: Dict[str, Any]


class MemvizStats(TypedDict):
    """The totals ``python torch/cuda/_memory_viz.py stats FILE`` prints."""

    segments: int
    total_reserved_bytes: int
    total_allocated_bytes: int
    free_internal_bytes: int
    free_external_bytes: int
    lines: List[str]


# The key is PyTorch's environment variable name, not an identifier: the functional form.
_SettingsKeys = TypedDict(
    "_SettingsKeys",
    {
        "PYTORCH_CUDA_ALLOC_CONF": Optional[str],
        "max_split_size": Optional[int],
        "garbage_collection_threshold": Optional[float],
        "expandable_segments": Optional[bool],
        "roundup_power2_divisions": List[List[int]],
    },
)


class Settings(_SettingsKeys, total=False):
    """``allocator_settings`` as the file recorded them (PyTorch 2.3+)."""

    #: Parts of the recorded settings string the parser cannot read (``item`` as written,
    #: ``error`` the parser's words); absent when every part was read.
    unread: List[Dict[str, str]]


class _FileSummaryOptional(TypedDict, total=False):
    #: Pinned host memory, apart from every device's figures (absent without it).
    host: Dict[str, Any]
    #: Per device, one band per memory pool (absent unless a private pool holds segments).
    private_pools: List[Dict[str, Any]]


class FileSummary(_FileSummaryOptional):
    """One FILE of ``fragscope summary --json``."""

    file: str
    example: bool
    format: str
    devices: List[DeviceSummary]
    memviz_stats: MemvizStats
    settings: Optional[Settings]
    notes: Dict[str, Any]
    profiler_totals: List[Dict[str, Any]]
    #: ``None`` for the whole file; with ``--window`` the window the figures cover.
    window: Optional[Dict[str, Any]]
    #: The file's first OOM (``device``, ``event_index``, ``time_us``, ``verdict``,
    #: ``headline``), which the text leads with; ``None`` without one.
    oom: Optional[Dict[str, Any]]


class SummaryDoc(TypedDict):
    schema: str
    files: List[FileSummary]


# --- fragscope.analyze/1 ---------------------------------------------------------------


class Finding(TypedDict):
    """A headline of ``analyze``, most important first."""

    kind: str
    severity: str
    headline: str


class Recommendations(TypedDict):
    """Settings replayed and ranked (a device with an OOM, or ``what_if=True``)."""

    device: int
    measured: bool
    note: Optional[str]
    era: Dict[str, Any]
    capacity_bytes: Optional[int]
    baseline: Optional[Dict[str, Any]]
    recommended: List[Dict[str, Any]]
    tried: List[Dict[str, Any]]
    advice: List[Dict[str, Any]]
    advice_notes: List[str]
    #: Settings and advice that save, in the one ranking (saving, then cost; docs/glossary.md).
    ranked: List[Dict[str, Any]]


class LeakSteps(TypedDict):
    """``DeviceAnalysis.leak_steps``: the training steps the leak test compared."""

    #: ``"steps"`` or ``"none"`` (fewer than two steps, or steps that are not a steady loop).
    source: str
    steps: int
    can_tell: bool
    #: Trace entries: the first step's start, then each step's end (empty when ``can_tell`` is false).
    boundaries: List[int]
    #: Why leaks cannot be told, and how to record a trace that can.
    reason: Optional[str]


class LeakSuspect(TypedDict):
    """One entry of ``DeviceAnalysis.leak_suspects``: a call site whose memory outlives its
    step and grows across steps."""

    site: str
    file: str
    line: int
    function: str
    stack: str
    growth_bytes_per_step: int
    steps: int
    steps_compared: int
    growing_steps: int
    r_squared: float
    confidence: float
    first_bytes: int
    last_bytes: int
    end_bytes: int
    never_freed_blocks: int
    never_freed_bytes: int
    first_never_freed_entry: Optional[int]
    last_never_freed_entry: Optional[int]
    first_never_freed_time_us: Optional[int]
    freed_blocks: int
    #: Role name -> bytes of the site's kept blocks.
    kept_roles: Dict[str, int]
    curve: List[Dict[str, Any]]
    grew_in: List[Dict[str, Any]]
    evidence: List[str]


class DeviceAnalysis(TypedDict):
    """One device of ``fragscope analyze --json``."""

    device: int
    findings: List[Finding]
    oom: Optional[Dict[str, Any]]
    #: ``1 − peak allocated / peak reserved``: the share of the reserved peak that tensors
    #: never used together. Not ``Fragmentation.free_space_fragmentation``.
    peak_fragmentation: Optional[float]
    fragmentation: Dict[str, Any]
    #: Memory that outlives its training step and grows across steps (``LeakSuspect``).
    leak_suspects: List["LeakSuspect"]
    #: The steps the leak test compared, and whether leaks can be told from the trace.
    leak_steps: "LeakSteps"
    peaks: Dict[str, Any]
    recommendations: Recommendations
    role_what_if: Optional["RoleRows"]
    #: Training steps bounded by evidence, their phases and layers.
    steps: Dict[str, Any]
    #: Memory by role, as in ``DeviceSummary.roles``.
    roles: Dict[str, Any]


class _FileAnalysisOptional(TypedDict, total=False):
    #: How the file was recorded (``notes.recording`` of ``summary``), absent when empty.
    recording: List[str]


class FileAnalysis(_FileAnalysisOptional):
    file: str
    format: str
    era: Dict[str, Any]
    recorded_config: Optional[str]
    #: The file's first OOM, as in ``FileSummary.oom``; ``None`` without one.
    oom: Optional[Dict[str, Any]]
    #: Findings about the file as a whole (``device_imbalance``).
    findings: List[Finding]
    #: The device holding far more than its peers, when one does.
    device_imbalance: Optional[Dict[str, Any]]
    devices: List[DeviceAnalysis]
    #: ``None`` for the whole file; with ``--window`` the window the figures cover.
    window: Optional[Dict[str, Any]]


class AnalyzeDoc(TypedDict):
    schema: str
    files: List[FileAnalysis]


# --- fragscope.replay.lab/2 ------------------------------------------------------------


class LabRow(TypedDict):
    """One allocation policy's run in the allocator lab."""

    policy: str
    peak_reserved: int
    ratio: float
    final_reserved: int
    calls: Dict[str, int]
    seconds: float
    ops_per_second: float
    cpu_seconds: Optional[float]
    events_per_cpu_second: Optional[float]
    ooms_at_capacity: int
    first_oom_at_capacity: Optional[Dict[str, Any]]
    recorded_ooms_served: int
    verdict: str
    #: With ``min_capacity=True``/``--min-capacity``: the smallest device without an OOM.
    min_capacity: Optional[int]


class LabReport(TypedDict):
    """One device of the allocator lab."""

    device: int
    trace_events: int
    ops: int
    requests: int
    streams: int
    pre_existing_blocks: int
    recorded_ooms: int
    capacity: int
    capacity_source: str
    bounds: Dict[str, int]
    rows: List[LabRow]
    notes: List[str]


class LabFile(TypedDict):
    file: str
    devices: List[LabReport]


class LabDoc(TypedDict):
    schema: str
    files: List[LabFile]


# --- role-level what-ifs (fragscope replay --shard-optimizer/--shard-gradients/... ) ------


class ChangeOutcome(TypedDict):
    """One change of a role-level what-if: what it did, or why it cannot be applied."""

    change: str
    applied: bool
    cannot_apply: Optional[str]
    blocks: int
    bytes: int
    detail: str


class RoleRow(TypedDict):
    change: str
    applied: bool
    cannot_apply: Optional[str]
    peak_reserved_bytes: Optional[int]
    peak_allocated_bytes: Optional[int]
    #: The most reserved just after a cudaMalloc of the trace's requests (0: none).
    peak_reserved_by_trace_bytes: Optional[int]
    #: Set when the peak reserved is the memory reserved before the recording began (a
    #: floor the change cannot lower): says so, with the peak inside the trace.
    reserved_floor: Optional[str]
    first_oom_index: Optional[int]
    oom_avoided: Optional[bool]


class RoleRows(TypedDict):
    """``analyze``'s role-level what-ifs of one device (models of the changes, replayed)."""

    label: str
    steps: str
    capacity_bytes: Optional[int]
    recorded_peak_reserved_bytes: int
    recorded_peak_allocated_bytes: int
    recorded_first_oom_index: Optional[int]
    rows: List[RoleRow]
    not_modelled: List[str]


class RoleWhatIf(TypedDict):
    """The recorded program changed (ZeRO-1/2 sharding, ``zero_grad(set_to_none=True)``,
    activation checkpointing) and replayed: a model of the change, not a recording."""

    device: int
    label: str
    steps: str
    changes: List[ChangeOutcome]
    applied: bool
    capacity: Optional[int]
    recorded: Dict[str, Any]
    changed: Optional[Dict[str, Any]]
    recorded_oom: Optional[int]
    oom_avoided: Optional[bool]
    fits: Optional[bool]
    verdict: str
    not_modelled: List[str]


# --- documents docs/json-schema.md does not detail yet: their top level only -------------


class ReplayDoc(TypedDict):
    """``fragscope.replay.verify/1`` / ``fragscope.replay.whatif/1``."""

    schema: str
    files: List[Dict[str, Any]]


class DiffDoc(TypedDict):
    """``fragscope.diff/1``."""

    schema: str
    a: str
    b: str
    devices: List[Dict[str, Any]]
    only_in_a: List[Dict[str, Any]]
    only_in_b: List[Dict[str, Any]]


class CheckDoc(TypedDict):
    """``fragscope check --json`` (``schema``: ``"fragscope.check/1"``)."""

    schema: str
    ok: bool
    limits: Dict[str, Any]
    devices: List[Dict[str, Any]]
    failures: List[Dict[str, Any]]

