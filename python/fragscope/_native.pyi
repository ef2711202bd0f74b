"""Type stubs of the Rust extension module (crates/python). Use the `fragscope` package."""

from os import PathLike
from typing import List, Optional, Tuple, Union

__version__: str

class Snapshot:
    @property
    def name(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def devices(self) -> List[int]: ...
    @property
    def trace_events(self) -> int: ...
    @property
    def segments(self) -> int: ...
    def summary_json(self, window: Optional[str] = None) -> str: ...
    def analyze_json(self, top: int = 10, what_if: bool = False, window: Optional[str] = None) -> str: ...
    def replay_json(
        self,
        verify: bool = False,
        configs: List[str] = ...,
        capacity: Optional[str] = None,
        device: Optional[int] = None,
        save_snapshot: Optional[Union[str, PathLike[str]]] = None,
        empty_cache_at: List[str] = ...,
        no_caching: bool = False,
        shard_optimizer: Optional[int] = None,
        shard_gradients: Optional[int] = None,
        grads_set_to_none: bool = False,
        checkpoint: Optional[str] = None,
    ) -> str: ...
    def lab_json(
        self,
        allocators: List[str],
        capacity: Optional[str] = None,
        device: Optional[int] = None,
    ) -> str: ...
    def report_html(self) -> str: ...
    def check_json(
        self,
        max_reserved: Optional[str] = None,
        max_allocated: Optional[str] = None,
        max_peak_fragmentation: Optional[str] = None,
        no_leaks: bool = False,
    ) -> Tuple[str, bool, Optional[str]]: ...
    def diff_json(self, other: Snapshot, top: int = 10) -> str: ...
    def state_json(
        self,
        at: Optional[int] = None,
        time: Optional[str] = None,
        device: Optional[int] = None,
        by: str = "site",
        top: int = 10,
    ) -> str: ...
    def blocks(self, site: Optional[str] = None, allocated_only: bool = True) -> List[Tuple[int, int, int, str, str]]: ...
    def save(self, path: Union[str, PathLike[str]]) -> None: ...

def load(path: Union[str, PathLike[str]], name: Optional[str] = None) -> Snapshot: ...
def loads(data: bytes, name: Optional[str] = None) -> Snapshot: ...
def from_dict(obj: object, name: Optional[str] = None) -> Snapshot: ...
def example() -> Snapshot: ...
def analyze_many(
    paths: List[str], top: int = 10, what_if: bool = False, threads: int = 0
) -> List[Tuple[bool, str]]: ...
def run_cli(argv: List[str]) -> int: ...

def report_html_many(snapshots: List[Snapshot]) -> str: ...
def explain_oom_json(text: str) -> str: ...

def predict_json(
    snapshots: List[Snapshot],
    sizes: List[int],
    at: List[int],
    config: Optional[str] = None,
    capacity: Optional[str] = None,
    max_fit: bool = False,
    device: Optional[int] = None,
) -> str: ...
