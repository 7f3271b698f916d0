"""Compressed collectives: drop-in replacements for lax's, as JAX primitives.

One module per collective holds its lowering (the byte algorithm) and its
user-facing function: psum.py, all_gather.py, psum_scatter.py, all_to_all.py,
ppermute.py. What they share: _mirror.py (the primitives and their rules,
which are lax's own), _rewrite.py (lax collectives -> zip collectives in a
jaxpr or function: `compressed`), _transfer.py (streams, the size consensus
and the capacity ladder).
"""

from ._rewrite import compressed
from ._transfer import Stats
from .all_gather import zip_all_gather
from .all_to_all import zip_all_to_all
from .ppermute import zip_ppermute
from .psum import zip_psum
from .psum_scatter import zip_psum_scatter

__all__ = ["Stats", "compressed", "zip_all_gather", "zip_all_to_all", "zip_ppermute", "zip_psum", "zip_psum_scatter"]
