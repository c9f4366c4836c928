"""One map's per-(cell, time block) and per-(cell, category) totals in one compiled pass over the requests.

numpy needed a code array, a mask and a float copy per column per slice, three bincounts (which hold the GIL) and
the pair columns built beforehand; the kernel reads each request once and adds it where it belongs.

The sums match numpy's bit for bit: float columns are summed row by row within each slice of SLICE_ROWS rows
(as a bincount over that slice would) and each slice's sums added to the totals; integer and flag columns are
exact in float64 whatever the order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, types

from orchestrator.analysis.slices import SLICE_ROWS
from orchestrator.analysis.speedup import CLOCK, PAIR_COLUMNS

STAT_COLUMNS = CLOCK + 1  # request_stats' columns
CATEGORY_COLUMNS = 5  # ok, steps, executed k, speculative steps, accepted tokens


@dataclass(frozen=True)
class CellTotals:
    cell_of: np.ndarray  # int32 per request: band * arms + arm, -1 when unbanded
    totals: np.ndarray  # (cells * blocks_per_cell, STAT_COLUMNS)
    counts: np.ndarray  # requests per row of totals
    pair_totals: np.ndarray  # (cells * blocks_per_cell, PAIR_COLUMNS): requests whose baseline copy is in-band
    pair_counts: np.ndarray
    category_totals: np.ndarray  # (cells * categories, CATEGORY_COLUMNS); category slot 0 is "no category"
    category_counts: np.ndarray


def _array(dtype: types.Type, ndim: int = 1, readonly: bool = False) -> types.Array:
    return types.Array(dtype, ndim, "C", readonly=readonly)


# Inputs read-only in the signature: a writable array matches it too.
_I32, _I64, _F64, _BOOL = (_array(t, readonly=True) for t in (types.int32, types.int64, types.float64, types.boolean))
_F64_2D = _array(types.float64, 2)
_SIGNATURE = types.void(
    # band, arm, category, run block, baseline partner
    _I32, _I32, _I32, _I64, _I64,
    # log tpot, usable, met, clock, ok, steps, k sum, spec steps, accepted
    _F64, _BOOL, _BOOL, _F64, _BOOL, _I32, _I32, _I32, _I32,
    # arms, baseline arm code, blocks per cell, categories, slice rows
    types.int64, types.int64, types.int64, types.int64, types.int64,
    # outputs: cell_of, totals, counts, pair totals, pair counts, category totals, category counts
    _array(types.int32), _F64_2D, _array(types.int64), _F64_2D, _array(types.int64), _F64_2D, _array(types.int64),
)  # fmt: skip


# Signature given, so the kernel is compiled (or loaded from numba's cache) at import, not on first use.
@njit(_SIGNATURE, cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _accumulate(  # pragma: no cover
    band: np.ndarray,
    arm: np.ndarray,
    category: np.ndarray,
    run_block: np.ndarray,
    partner: np.ndarray,
    log_tpot: np.ndarray,
    usable: np.ndarray,
    met: np.ndarray,
    clock: np.ndarray,
    ok: np.ndarray,
    steps: np.ndarray,
    k_sum: np.ndarray,
    spec_steps: np.ndarray,
    accepted: np.ndarray,
    n_arms: int,
    base_code: int,
    per_cell: int,
    n_categories: int,
    slice_rows: int,
    cell_of: np.ndarray,
    totals: np.ndarray,
    counts: np.ndarray,
    pair_totals: np.ndarray,
    pair_counts: np.ndarray,
    category_totals: np.ndarray,
    category_counts: np.ndarray,
) -> None:
    rows = len(band)
    scratch = np.zeros(totals.shape)
    pair_scratch = np.zeros(pair_totals.shape)
    for start in range(0, rows, slice_rows):
        scratch[:] = 0.0
        pair_scratch[:] = 0.0
        for i in range(start, min(start + slice_rows, rows)):
            b = band[i]
            a = arm[i]
            if b < 0 or a < 0:
                cell_of[i] = -1
                continue
            cell = b * n_arms + a
            cell_of[i] = cell
            block = cell * per_cell + run_block[i]
            counts[block] += 1
            scratch[block, 0] += log_tpot[i]
            scratch[block, 1] += usable[i]
            scratch[block, 2] += met[i]
            scratch[block, 3] += clock[i]
            slot = cell * n_categories + category[i] + 1
            category_counts[slot] += 1
            category_totals[slot, 0] += ok[i]
            category_totals[slot, 1] += steps[i]
            category_totals[slot, 2] += k_sum[i]
            category_totals[slot, 3] += spec_steps[i]
            category_totals[slot, 4] += accepted[i]
            p = partner[i]
            if p < 0 or a == base_code or band[p] != b:
                continue
            both = usable[i] and usable[p]
            pair_counts[block] += 1
            pair_scratch[block, 0] += log_tpot[p] - log_tpot[i] if both else 0.0
            pair_scratch[block, 1] += both
            pair_scratch[block, 2] += met[i]
            pair_scratch[block, 3] += met[p]
            pair_scratch[block, 4] += clock[i]
            pair_scratch[block, 5] += clock[p]
        totals += scratch
        pair_totals += pair_scratch


def cell_totals(
    *,
    band: np.ndarray,
    arm: np.ndarray,
    category: np.ndarray,
    n_arms: int,
    n_cells: int,
    n_categories: int,
    base_code: int,
    run_block: np.ndarray,
    per_cell: int,
    partner: np.ndarray,
    stats: list[np.ndarray],
    additive: list[np.ndarray],
) -> CellTotals:
    """`stats`: request_stats' columns; `additive`: ok, steps, k sum, spec steps, accepted; `partner`: the
    baseline row of each request, -1 for none; `category`: codes, -1 for none (n_categories counts that slot)."""
    size = n_cells * per_cell
    out = CellTotals(
        cell_of=np.empty(len(band), dtype=np.int32),
        totals=np.zeros((size, STAT_COLUMNS)),
        counts=np.zeros(size, dtype=np.int64),
        pair_totals=np.zeros((size, PAIR_COLUMNS)),
        pair_counts=np.zeros(size, dtype=np.int64),
        category_totals=np.zeros((n_cells * n_categories, CATEGORY_COLUMNS)),
        category_counts=np.zeros(n_cells * n_categories, dtype=np.int64),
    )
    log_tpot, usable, met, clock = stats
    ok, steps, k_sum, spec_steps, accepted = additive

    def ints(values: np.ndarray, dtype: type = np.int32) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=dtype)  # no copy when already so

    def floats(values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=np.float64)

    def flags(values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=np.bool_)

    _accumulate(
        ints(band), ints(arm), ints(category), ints(run_block, np.int64), ints(partner, np.int64),
        floats(log_tpot), flags(usable), flags(met), floats(clock),
        flags(ok), ints(steps), ints(k_sum), ints(spec_steps), ints(accepted),
        n_arms, base_code, per_cell, n_categories, SLICE_ROWS,
        out.cell_of, out.totals, out.counts, out.pair_totals, out.pair_counts, out.category_totals, out.category_counts,
    )  # fmt: skip
    return out
