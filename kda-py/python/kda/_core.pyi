"""The native module of kda (built from kda-py/src by maturin). Call the functions of
:mod:`kda` instead: they check and convert arguments."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

def delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    o: np.ndarray,
    cu_seqlens: Sequence[int],
    scale: float,
    *,
    a_log: Optional[np.ndarray] = None,
    dt_bias: Optional[np.ndarray] = None,
    initial_state: Optional[np.ndarray] = None,
    final_state: Optional[np.ndarray] = None,
    l2norm: bool = False,
    gate: str = "none",
    lower_bound: Optional[float] = None,
    beta_factor: Optional[float] = None,
    chunked: bool = False,
    v_first: bool = False,
    threads: Optional[int] = None,
) -> int: ...
def fla_forward(
    chunked: bool,
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    a_log: Any,
    dt_bias: Any,
    scale: Any,
    initial_state: Any,
    output_final_state: Any,
    l2norm: Any,
    gate_in_kernel: Any,
    beta_sigmoid: Any,
    allow_neg_eigval: Any,
    lower_bound: Any,
    v_first: Any,
    cu_seqlens: Any,
    threads: Any,
) -> Optional[Tuple[Any, Optional[Any]]]: ...
def fused_recurrent_kda(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    A_log: Any = None,
    dt_bias: Any = None,
    scale: Optional[float] = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Any = None,
    threads: Optional[int] = None,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any]]: ...
def last_compute_ns() -> int: ...
def new_f32(shape: List[int]) -> Any: ...
def empty_cache() -> None: ...
def cache_info() -> Tuple[int, int]: ...

class Buffer:
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
def set_num_threads(threads: Optional[int] = None) -> None: ...
def get_num_threads() -> int: ...

class KdaCache:
    @property
    def sequences(self) -> int: ...
    def clone(self) -> "KdaCache": ...
    def reset(self) -> None: ...
    def save(self, path: str) -> None: ...
    def to_bytes(self) -> bytes: ...
    def recurrent_state_bytes(self) -> bytes: ...

class KdaLayer:
    @staticmethod
    def from_pretrained(path: str, layer: int, precision: str = "exact") -> "KdaLayer": ...
    @property
    def layer(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def conv_width(self) -> int: ...
    def new_cache(self, sequences: int = 1) -> KdaCache: ...
    def prefill(
        self, x: np.ndarray, cache: KdaCache, out: np.ndarray, cu_seqlens: Sequence[int], threads: Optional[int] = None
    ) -> None: ...
    def decode(self, x: np.ndarray, cache: KdaCache, out: np.ndarray, threads: Optional[int] = None) -> None: ...
    def load_cache(self, path: str) -> KdaCache: ...
    def cache_from_bytes(self, data: bytes) -> KdaCache: ...
