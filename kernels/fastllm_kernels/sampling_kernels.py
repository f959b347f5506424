"""Device code of :mod:`fastllm_kernels.sampling`: four launches, the first three over a grid
of (row, vocabulary slice) programs so that even one row fills the GPU (``logsumexp_argmax``:
the first, then one program a row).

1. ``stats``: per slice, max / argmax / softmax sum / smallest finite z / finite count.
2. ``histogram``: per slice, count and mass at or above 16 pivots spaced geometrically below
   the row max (filtered rows only). The highest pivot that still satisfies the row's top-k
   (else top-p) need is ``lower``; the pivot above it, ``upper``, fails it, so the cut lies in
   the band ``[lower, upper)`` and, for top-p alone, every token at or above ``upper`` is kept.
3. ``compact_or_race``: each slice copies its band tokens into a small per-row buffer at its
   own offset, and runs the exponential race over its tokens at or above ``upper`` (all
   finite tokens for an unfiltered row).
4. ``finish``: per row, the exact cut by k-ary search over the buffer, the race over the kept
   part of the band, and the best of that and the slices' races. Greedy rows take the
   argmax. A row whose band overflows the buffer searches and races its whole row in this one
   program (exact, slower; it takes a near-flat distribution).

Loops keep per-lane partial results and reduce once at the end. ``z`` is
``logit / temperature`` in float32, computed the same way everywhere.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_settings(temperature_ptr, top_k_ptr, top_p_ptr, row, greedy_below):
    """(sampled, i.e. not greedy; 1 / temperature; top_k; top_p) of one row."""
    temperature = tl.load(temperature_ptr + row)
    sampled = temperature >= greedy_below
    return (sampled, 1.0 / tl.where(sampled, temperature, 1.0), tl.load(top_k_ptr + row),
            tl.load(top_p_ptr + row))


@triton.jit
def _row_stats(stats_ptr, argmax_ptr, row, num_slices, SLICES_PAD: tl.constexpr):
    """Combine the slices' stats: (z max, first argmax, softmax sum about the max,
    smallest finite z, number of finite tokens)."""
    slices = tl.arange(0, SLICES_PAD)
    valid = slices < num_slices
    base = stats_ptr + (row * num_slices + slices) * 4
    z_max = tl.load(base, mask=valid, other=float("-inf"))
    total = tl.load(base + 1, mask=valid, other=0.0)
    z_min = tl.load(base + 2, mask=valid, other=float("inf"))
    finite = tl.load(base + 3, mask=valid, other=0.0)
    arg = tl.load(argmax_ptr + row * num_slices + slices, mask=valid, other=0)
    row_max = tl.max(z_max, 0)
    ref = tl.where(row_max == float("-inf"), 0.0, row_max)
    row_sum = tl.sum(total * tl.exp(z_max - ref), 0)
    row_arg = tl.min(tl.where(z_max == row_max, arg, 2147483647), 0)
    return row_max, row_arg, row_sum, tl.min(z_min, 0), tl.sum(finite, 0).to(tl.int32)


@triton.jit
def _pivots(z_max, z_min, NUM_BINS: tl.constexpr):
    """z_max - 0.25 * 1.4**j, the last one at the smallest finite z; never below it."""
    j = tl.arange(0, NUM_BINS)
    gap = 0.25 * tl.exp(j.to(tl.float32) * 0.33647223662121289)
    return tl.maximum(tl.where(j == NUM_BINS - 1, z_min, z_max - gap), z_min)


@triton.jit
def _band(counts_ptr, masses_ptr, row, use_k, top_k, top_p, total, z_max, z_min,
          num_slices, SLICES_PAD: tl.constexpr, NUM_BINS: tl.constexpr):
    """The band ``[lower, upper)`` that holds the cut, and per bound the count and mass of
    the tokens at or above it (``upper`` is +inf, with 0 and 0, when top-k is on: top-p may
    then cut anywhere inside the top-k set). Also the bins of both bounds."""
    slices = tl.arange(0, SLICES_PAD)
    bins = tl.arange(0, NUM_BINS)
    offs = (row * num_slices + slices)[:, None] * NUM_BINS + bins[None, :]
    valid = (slices < num_slices)[:, None]
    counts = tl.sum(tl.load(counts_ptr + offs, mask=valid, other=0), 0)
    masses = tl.sum(tl.load(masses_ptr + offs, mask=valid, other=0.0), 0)
    short = tl.where(use_k, counts < top_k, masses < top_p * total)
    edge = tl.minimum(tl.sum(short.to(tl.int32), 0), NUM_BINS - 1)
    pivots = _pivots(z_max, z_min, NUM_BINS)
    above = (edge > 0) & (use_k == 0)
    upper_bin = tl.where(above, edge - 1, NUM_BINS)
    lower = tl.sum(tl.where(bins == edge, pivots, 0.0), 0)
    upper = tl.where(above, tl.sum(tl.where(bins == upper_bin, pivots, 0.0), 0), float("inf"))
    return (lower, upper, tl.sum(tl.where(bins == edge, counts, 0), 0),
            tl.sum(tl.where(bins == upper_bin, counts, 0), 0),
            tl.sum(tl.where(bins == edge, masses, 0.0), 0),
            tl.sum(tl.where(bins == upper_bin, masses, 0.0), 0), edge, upper_bin)


@triton.jit
def _count_and_mass(z_ptr, length, inv_t, z_max, pivots, BLOCK: tl.constexpr,
                    NUM_PIVOTS: tl.constexpr):
    """Per pivot: how many of ``z_ptr[:length] * inv_t`` are >= it, and their exp(z - z_max) sum."""
    count = tl.zeros([BLOCK, NUM_PIVOTS], tl.int32)
    mass = tl.zeros([BLOCK, NUM_PIVOTS], tl.float32)
    for start in range(0, length, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(z_ptr + cols, mask=cols < length, other=float("-inf")) * inv_t
        above = z[:, None] >= pivots[None, :]
        count += above.to(tl.int32)
        mass += tl.where(above, tl.exp(z - z_max)[:, None], 0.0)
    return tl.sum(count, 0), tl.sum(mass, 0)


@triton.jit
def _search_cut(z_ptr, length, inv_t, z_max, lo, hi, count_lo, count_hi, mass_lo, base_count,
                base_mass, need_count, need_mass,
                BLOCK: tl.constexpr, NUM_PIVOTS: tl.constexpr, MAX_PASSES: tl.constexpr):
    """Raise the cut ``lo`` while the tokens at or above it number >= need_count and weigh
    >= need_mass; ``lo`` satisfies both and ``hi`` does not (``hi`` = z_max with count_hi 0
    stands for "above the max"). The tokens in ``z_ptr`` are those below ``hi``; the
    base_count / base_mass more at or above ``hi`` are added to every pivot. Stops when one
    token separates the bounds, when the count is exactly what is needed, or when the bounds
    are adjacent floats (ties stay together). Returns the cut and its count and mass."""
    fraction = (tl.arange(0, NUM_PIVOTS) + 1).to(tl.float32) / (NUM_PIVOTS + 1)
    moved = count_lo >= 0
    passes = 0
    while moved & (count_lo - count_hi > 1) & (count_lo != need_count) & (passes < MAX_PASSES):
        pivots = lo + (hi - lo) * fraction
        count, mass = _count_and_mass(z_ptr, length, inv_t, z_max, pivots, BLOCK, NUM_PIVOTS)
        count += base_count
        mass += base_mass
        ok = (count >= need_count) & (mass >= need_mass)
        new_lo = tl.max(tl.where(ok, pivots, lo), 0)
        new_hi = tl.min(tl.where(ok, hi, pivots), 0)
        moved = (new_lo != lo) | (new_hi != hi)
        lo, hi = new_lo, new_hi
        count_lo = tl.min(tl.where(ok, count, count_lo), 0)
        count_hi = tl.max(tl.where(ok, count_hi, count), 0)
        mass_lo = tl.min(tl.where(ok, mass, mass_lo), 0)
        passes += 1
    return lo, count_lo, mass_lo


@triton.jit
def _find_cut(z_ptr, length, inv_t, z_max, lo, hi, count_lo, count_hi, mass_lo, base_count,
              base_mass, total, use_k, top_k, top_p,
              BLOCK: tl.constexpr, NUM_PIVOTS: tl.constexpr, MAX_PASSES: tl.constexpr):
    """The cut of top-k, then top-p of what is left (``total`` is the row's whole mass, what
    top-p is a fraction of when top-k is off); arguments as for :func:`_search_cut`."""
    cut, count, mass = _search_cut(z_ptr, length, inv_t, z_max, lo, hi, count_lo, count_hi,
                                   mass_lo, base_count, base_mass,
                                   tl.where(use_k, top_k, count_lo), 0.0,
                                   BLOCK, NUM_PIVOTS, MAX_PASSES)
    use_p = top_p < 1.0
    kept_mass = tl.where(use_k, mass, total)
    cut, _, _ = _search_cut(z_ptr, length, inv_t, z_max, cut, hi, count, count_hi, mass,
                            base_count, base_mass, tl.where(use_p, 1, count),
                            tl.where(use_p, top_p * kept_mass, 0.0), BLOCK, NUM_PIVOTS, MAX_PASSES)
    return cut


@triton.jit
def _exponential(seed, tokens, offset):
    """Exp(1) noise per token from Philox(seed; token, offset), resolved to 2**-64 near 0,
    where the race is decided."""
    c0 = tokens.to(tl.uint32)
    c1 = tl.zeros_like(c0) + (offset & 0xFFFFFFFF).to(tl.uint32)
    c2 = tl.zeros_like(c0) + ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
    r0, r1, _, _ = tl.philox(seed, c0, c1, c2, tl.zeros_like(c0))
    w = r0.to(tl.float32) * 2.3283064365386963e-10 + r1.to(tl.float32) * 5.421010862427522e-20
    # -log1p(-w) without log1p: Kahan's correction keeps small w exact.
    u = 1.0 - w
    return tl.where(u == 1.0, w, -tl.log(u) * w / (1.0 - u))


@triton.jit
def _race(z_ptr, tokens_ptr, first_token, length, inv_t, cut, upper, seed, offset,
          BLOCK: tl.constexpr, HAS_TOKENS: tl.constexpr):
    """argmax of z - log(E) over cut <= z < upper: the best score (-inf if none) and its
    token. Tokens are ``tokens_ptr[i]`` if HAS_TOKENS, else ``first_token + i``."""
    lane_score = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_token = tl.zeros([BLOCK], tl.int32)
    for start in range(0, length, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(z_ptr + cols, mask=cols < length, other=float("-inf")) * inv_t
        keep = (z >= cut) & (z < upper)
        if tl.max(keep.to(tl.int32), 0) > 0:
            if HAS_TOKENS:
                tokens = tl.load(tokens_ptr + cols, mask=cols < length, other=0)
            else:
                tokens = first_token + cols
            score = tl.where(keep, z - tl.log(_exponential(seed, tokens, offset)), float("-inf"))
            lane_token = tl.where(score > lane_score, tokens, lane_token)
            lane_score = tl.maximum(lane_score, score)
    best = tl.max(lane_score, 0)
    return best, tl.sum(tl.where(tl.arange(0, BLOCK) == tl.argmax(lane_score, 0), lane_token, 0), 0)


@triton.jit
def _stats_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, stats_ptr, argmax_ptr,
                  stride_row, vocab, slice_len, greedy_below, BLOCK: tl.constexpr, SCALED: tl.constexpr):
    """Per (row, slice): the stats ``_row_stats`` combines; of the logits themselves without
    ``SCALED`` (no settings read)."""
    row = tl.program_id(0)
    part = row * tl.num_programs(1) + tl.program_id(1)
    inv_t = 1.0
    if SCALED:
        _, inv_t, _, _ = _row_settings(temperature_ptr, top_k_ptr, top_p_ptr, row, greedy_below)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    start = tl.program_id(1) * slice_len
    end = tl.minimum(start + slice_len, vocab)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    lane_min = tl.full([BLOCK], float("inf"), tl.float32)
    lane_arg = tl.zeros([BLOCK], tl.int32)
    lane_finite = tl.zeros([BLOCK], tl.int32)
    for chunk in range(start, end, BLOCK):
        cols = chunk + tl.arange(0, BLOCK)
        z = tl.load(row_ptr + cols, mask=cols < end, other=float("-inf")).to(tl.float32) * inv_t
        lane_arg = tl.where(z > lane_max, cols, lane_arg)
        new_max = tl.maximum(lane_max, z)
        ref = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - ref) + tl.exp(z - ref)
        lane_max = new_max
        finite = z > float("-inf")
        lane_min = tl.where(finite, tl.minimum(lane_min, z), lane_min)
        lane_finite += finite.to(tl.int32)
    z_max = tl.max(lane_max, 0)
    ref = tl.where(z_max == float("-inf"), 0.0, z_max)
    tl.store(stats_ptr + part * 4, z_max)
    tl.store(stats_ptr + part * 4 + 1, tl.sum(lane_sum * tl.exp(lane_max - ref), 0))
    tl.store(stats_ptr + part * 4 + 2, tl.min(lane_min, 0))
    tl.store(stats_ptr + part * 4 + 3, tl.sum(lane_finite, 0).to(tl.float32))
    tl.store(argmax_ptr + part, tl.min(tl.where(lane_max == z_max, lane_arg, 2147483647), 0))


@triton.jit(do_not_specialize=["num_slices"])  # one variant whatever the batch
def _logsumexp_argmax_kernel(stats_ptr, argmax_ptr, lse_ptr, tokens_ptr, num_slices,
                             SLICES_PAD: tl.constexpr):
    """Per row, from the slices' stats: log-sum-exp (-inf for a row of -inf) and first argmax."""
    row = tl.program_id(0)
    row_max, row_arg, row_sum, _, _ = _row_stats(stats_ptr, argmax_ptr, row, num_slices, SLICES_PAD)
    tl.store(lse_ptr + row, tl.where(row_sum > 0, row_max + tl.log(row_sum), float("-inf")))
    tl.store(tokens_ptr + row, tl.where(row_sum > 0, row_arg, 0).to(tl.int64))


@triton.jit(do_not_specialize=["rows", "offset", "num_slices"])  # one variant whatever the batch
def _greedy_stats_kernel(stats_ptr, argmax_ptr, out_ptr, rows, offset, num_slices, SLICES_PAD: tl.constexpr):
    """Per row, from the slices' stats: its max logit, that token's id plus ``offset`` (float32)
    and the log-sum-exp, at ``out[0 | 1 | 2, row]``."""
    row = tl.program_id(0)
    row_max, row_arg, row_sum, _, _ = _row_stats(stats_ptr, argmax_ptr, row, num_slices, SLICES_PAD)
    tl.store(out_ptr + row, row_max)
    tl.store(out_ptr + rows + row, (tl.where(row_sum > 0, row_arg, 0) + offset).to(tl.float32))
    tl.store(out_ptr + 2 * rows + row, tl.where(row_sum > 0, row_max + tl.log(row_sum), float("-inf")))


@triton.jit(do_not_specialize=["rows"])
def _combine_greedy_kernel(gathered_ptr, tokens_ptr, logprobs_ptr, rows, RANKS: tl.constexpr, BLOCK: tl.constexpr):
    """Per row, over the ranks' ``[3, rows]`` stats in vocabulary order: the token of the first
    rank among equal maxima, and its logit less the log-sum-exp over every rank."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < rows
    lse_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lse_sum = tl.zeros([BLOCK], tl.float32)
    for rank in tl.static_range(RANKS):
        base = gathered_ptr + rank * 3 * rows
        rank_max = tl.load(base + offs, mask=mask, other=float("-inf"))
        rank_lse = tl.load(base + 2 * rows + offs, mask=mask, other=float("-inf"))
        if rank == 0:
            token = tl.load(base + rows + offs, mask=mask, other=0.0)
            best = rank_max
        else:
            wins = rank_max > best  # strictly: a tie stays with the lower ids
            token = tl.where(wins, tl.load(base + rows + offs, mask=mask, other=0.0), token)
            best = tl.where(wins, rank_max, best)
        new_max = tl.maximum(lse_max, rank_lse)
        ref = tl.where(new_max == float("-inf"), 0.0, new_max)
        lse_sum = lse_sum * tl.exp(lse_max - ref) + tl.exp(rank_lse - ref)
        lse_max = new_max
    lse = tl.where(lse_sum > 0, lse_max + tl.log(lse_sum), float("-inf"))
    tl.store(tokens_ptr + offs, token.to(tl.int64), mask=mask)
    tl.store(logprobs_ptr + offs, best - lse, mask=mask)


@triton.jit(do_not_specialize=["num_slices"])  # one variant whatever the batch
def _histogram_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, stats_ptr, argmax_ptr,
                      counts_ptr, masses_ptr, stride_row, vocab, slice_len, greedy_below,
                      num_slices, SLICES_PAD: tl.constexpr,
                      NUM_BINS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    sampled, inv_t, top_k, top_p = _row_settings(temperature_ptr, top_k_ptr, top_p_ptr, row,
                                                 greedy_below)
    z_max, _, _, z_min, num_finite = _row_stats(stats_ptr, argmax_ptr, row, num_slices, SLICES_PAD)
    if sampled & (((top_k > 0) & (top_k < num_finite)) | (top_p < 1.0)):
        start = tl.program_id(1) * slice_len
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row + start
        count, mass = _count_and_mass(row_ptr, tl.minimum(slice_len, vocab - start), inv_t, z_max,
                                      _pivots(z_max, z_min, NUM_BINS), BLOCK, NUM_BINS)
        part = (row * num_slices + tl.program_id(1)) * NUM_BINS + tl.arange(0, NUM_BINS)
        tl.store(counts_ptr + part, count)
        tl.store(masses_ptr + part, mass)


@triton.jit(do_not_specialize=["num_slices"])  # one variant whatever the batch
def _compact_or_race_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seeds_ptr,
                            offsets_ptr, stats_ptr, argmax_ptr, counts_ptr, masses_ptr,
                            buffer_z_ptr, buffer_token_ptr, race_ptr, race_token_ptr,
                            stride_row, vocab, slice_len, greedy_below,
                            num_slices, SLICES_PAD: tl.constexpr,
                            NUM_BINS: tl.constexpr, CAPACITY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    this = tl.program_id(1)
    sampled, inv_t, top_k, top_p = _row_settings(temperature_ptr, top_k_ptr, top_p_ptr, row,
                                                 greedy_below)
    if sampled:
        z_max, _, total, z_min, num_finite = _row_stats(stats_ptr, argmax_ptr, row, num_slices,
                                                        SLICES_PAD)
        use_k = (top_k > 0) & (top_k < num_finite)
        filtered = use_k | (top_p < 1.0)
        start = this * slice_len
        length = tl.minimum(slice_len, vocab - start)
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row + start
        lower, upper, count_lower, count_upper, _, _, lower_bin, upper_bin = _band(
            counts_ptr, masses_ptr, row, use_k, top_k, top_p, total, z_max, z_min,
            num_slices, SLICES_PAD, NUM_BINS)
        upper = tl.where(filtered, upper, z_min)
        score, token = _race(row_ptr, row_ptr, start, length, inv_t, upper, float("inf"),
                             tl.load(seeds_ptr + row), tl.load(offsets_ptr + row), BLOCK, False)
        tl.store(race_ptr + row * num_slices + this, score)
        tl.store(race_token_ptr + row * num_slices + this, token)
        if filtered & (count_lower - count_upper <= CAPACITY):
            slices = tl.arange(0, SLICES_PAD)
            previous = (row * num_slices + slices) * NUM_BINS
            earlier = slices < this
            # upper_bin broadcast first: the interpreter mishandles `tensor & scalar` masks.
            has_upper = (slices * 0 + upper_bin) < NUM_BINS
            before = (tl.load(counts_ptr + previous + lower_bin, mask=earlier, other=0)
                      - tl.load(counts_ptr + previous + upper_bin, mask=earlier & has_upper, other=0))
            position = row * CAPACITY + tl.sum(before, 0)
            for chunk in range(0, length, BLOCK):
                cols = chunk + tl.arange(0, BLOCK)
                z = tl.load(row_ptr + cols, mask=cols < length, other=float("-inf")) * inv_t
                keep = (z >= lower) & (z < upper)
                slot = position + tl.cumsum(keep.to(tl.int32), 0) - 1
                tl.store(buffer_z_ptr + slot, z, mask=keep)
                tl.store(buffer_token_ptr + slot, start + cols, mask=keep)
                position += tl.sum(keep.to(tl.int32), 0)


@triton.jit(do_not_specialize=["num_slices"])  # one variant whatever the batch
def _finish_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seeds_ptr, offsets_ptr,
                   stats_ptr, argmax_ptr, counts_ptr, masses_ptr, buffer_z_ptr, buffer_token_ptr,
                   race_ptr, race_token_ptr, out_ptr, stride_row, vocab, greedy_below,
                   num_slices, SLICES_PAD: tl.constexpr, NUM_BINS: tl.constexpr,
                   CAPACITY: tl.constexpr, NUM_PIVOTS: tl.constexpr, MAX_PASSES: tl.constexpr,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    sampled, inv_t, top_k, top_p = _row_settings(temperature_ptr, top_k_ptr, top_p_ptr, row,
                                                 greedy_below)
    z_max, token, total, z_min, num_finite = _row_stats(stats_ptr, argmax_ptr, row, num_slices,
                                                        SLICES_PAD)
    if sampled:
        slices = tl.arange(0, SLICES_PAD)
        scores = tl.load(race_ptr + row * num_slices + slices, mask=slices < num_slices,
                         other=float("-inf"))
        tokens = tl.load(race_token_ptr + row * num_slices + slices, mask=slices < num_slices,
                         other=0)
        best_score = tl.max(scores, 0)
        token = tl.where(best_score > float("-inf"),
                         tl.sum(tl.where(slices == tl.argmax(scores, 0), tokens, 0), 0), token)
        use_k = (top_k > 0) & (top_k < num_finite)
        if use_k | (top_p < 1.0):
            seed = tl.load(seeds_ptr + row)
            offset = tl.load(offsets_ptr + row)
            lower, upper, count_lower, count_upper, mass_lower, mass_upper, lower_bin, upper_bin = (
                _band(counts_ptr, masses_ptr, row, use_k, top_k, top_p, total, z_max, z_min,
                      num_slices, SLICES_PAD, NUM_BINS))
            band = count_lower - count_upper
            if band <= CAPACITY:
                z_ptr = buffer_z_ptr + row * CAPACITY
                cut = _find_cut(z_ptr, band, 1.0, z_max, lower, tl.minimum(upper, z_max),
                                count_lower, count_upper, mass_lower, count_upper, mass_upper,
                                total, use_k, top_k, top_p, BLOCK, NUM_PIVOTS, MAX_PASSES)
                band_score, band_token = _race(z_ptr, buffer_token_ptr + row * CAPACITY, 0, band,
                                               1.0, cut, float("inf"), seed, offset, BLOCK, True)
                token = tl.where(band_score > best_score, band_token, token)
            else:  # the band overflowed the buffer: search and race the whole row here
                row_ptr = logits_ptr + row.to(tl.int64) * stride_row
                none = num_finite * 0
                cut = _find_cut(row_ptr, vocab, inv_t, z_max, z_min, z_max, num_finite, none, total,
                                none, total * 0.0, total, use_k, top_k, top_p,
                                BLOCK, NUM_PIVOTS, MAX_PASSES)
                _, token = _race(row_ptr, row_ptr, 0, vocab, inv_t, cut, float("inf"), seed,
                                 offset, BLOCK, False)
    tl.store(out_ptr + row, token.to(tl.int64))
