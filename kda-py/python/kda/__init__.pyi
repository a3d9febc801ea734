"""Type stubs of the public API of kda."""

import os
from typing import Any, Optional, Sequence, Tuple, TypeVar, Union

from . import integrations as integrations

Array = TypeVar("Array")  # a torch.Tensor or a numpy.ndarray; results are of the same kind
PathLike = Union[str, "os.PathLike[str]"]

def chunk_kda(
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    scale: Optional[float] = None,
    initial_state: Optional[Array] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Any] = None,
    cu_seqlens_cpu: Optional[Any] = None,
    cp_context: Any = None,
    use_graph: bool = False,
    max_num_seqs: Optional[int] = None,
    A_log: Optional[Array] = None,
    dt_bias: Optional[Array] = None,
    threads: Optional[int] = None,
    **kwargs: Any,
) -> Tuple[Array, Optional[Array]]: ...
def fused_recurrent_kda(
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    A_log: Optional[Array] = None,
    dt_bias: Optional[Array] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Array] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Optional[Any] = None,
    threads: Optional[int] = None,
    **kwargs: Any,
) -> Tuple[Array, Optional[Array]]: ...
def set_num_threads(threads: Optional[int] = None) -> None: ...
def get_num_threads() -> int: ...
def last_compute_seconds() -> float: ...
def empty_cache() -> None:
    """Releases the memory of freed large outputs that kda keeps for reuse (at most 4 buffers, 1 GiB)."""
    ...

class KdaCache:
    @property
    def sequences(self) -> int: ...
    def clone(self) -> "KdaCache": ...
    def reset(self) -> None: ...
    def save(self, path: PathLike) -> None: ...
    def to_bytes(self) -> bytes: ...
    def recurrent_state(self) -> Any: ...

class KdaLayer:
    @classmethod
    def from_pretrained(cls, path: PathLike, layer: int = 0, precision: str = "exact") -> "KdaLayer": ...
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
    def load_cache(self, path: PathLike) -> KdaCache: ...
    def cache_from_bytes(self, data: bytes) -> KdaCache: ...
    def prefill(
        self, x: Array, cache: KdaCache, cu_seqlens: Optional[Sequence[int]] = None, threads: Optional[int] = None
    ) -> Array: ...
    def decode(self, x: Array, cache: KdaCache, threads: Optional[int] = None) -> Array: ...
