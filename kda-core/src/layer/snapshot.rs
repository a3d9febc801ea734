//! Chunk-boundary snapshots: the caches of a sequence after a given number of its tokens,
//! written during a forward (for prefix caching).
//!
//! A forward with snapshots splits each sequence's work at the listed positions: the conv and
//! the delta rule run up to the position, the caches are copied into the snapshot slot, and
//! the rest continues from there. In chunked mode the chunk grid restarts at every snapshot
//! position, so a snapshot is bitwise the final caches of a run over exactly that prefix, and
//! the tokens after it are bitwise those of a run resumed from the snapshot. With every
//! position a multiple of the chunk size (as [`snapshot_positions`] makes for `S` a multiple of
//! it), the grid does not move and the whole run is bitwise the run without snapshots.

use crate::cache::CachesMut;
use crate::config::KdaConfig;
use crate::error::KdaError;

/// One snapshot: the caches of sequence `seq` after `pos` of its tokens in this call
/// (`1 ≤ pos ≤` its length).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(C)]
pub struct SnapshotPos {
    /// Sequence index in the call.
    pub seq: usize,
    /// Tokens of that sequence consumed.
    pub pos: usize,
}

/// Where a forward writes snapshots.
#[derive(Debug)]
pub struct Snapshots<'a> {
    /// The snapshots to take, sorted by sequence then position, no duplicates.
    pub at: &'a [SnapshotPos],
    /// `M = at.len()` caches, one per snapshot in the order of `at`, in the layouts of
    /// [`crate::cache`] (`[M, H, K, V]` recurrent, `[M, H·K, W−1]` conv).
    pub states: CachesMut<'a>,
}

/// How many snapshots [`snapshot_positions`] lists for `cu_seqlens` and every `every` tokens:
/// `Σ ⌊len_n / every⌋`.
pub fn snapshot_count(cu_seqlens: &[usize], every: usize) -> Result<usize, KdaError> {
    check_every(every)?;
    let mut total = 0usize;
    for p in cu_seqlens.windows(2) {
        let len = p[1].checked_sub(p[0]).ok_or(KdaError::Offsets {
            reason: "must be non-decreasing",
        })?;
        total = total
            .checked_add(len / every)
            .ok_or(KdaError::Overflow { what: "snapshots" })?;
    }
    Ok(total)
}

/// Fills `out` (exactly [`snapshot_count`] long) with the positions `every, 2·every, …` of each
/// sequence up to its length (a final partial stretch has none), sorted by sequence.
pub fn snapshot_positions(
    cu_seqlens: &[usize],
    every: usize,
    out: &mut [SnapshotPos],
) -> Result<(), KdaError> {
    let m = snapshot_count(cu_seqlens, every)?;
    crate::error::check_len("snapshot positions", out.len(), m)?;
    let mut slots = out.iter_mut();
    for (seq, p) in cu_seqlens.windows(2).enumerate() {
        for j in 1..=(p[1] - p[0]) / every {
            if let Some(slot) = slots.next() {
                *slot = SnapshotPos {
                    seq,
                    pos: j * every,
                };
            }
        }
    }
    Ok(())
}

fn check_every(every: usize) -> Result<(), KdaError> {
    if every == 0 {
        return Err(KdaError::Config {
            field: "snapshot interval",
            reason: "must be at least 1",
        });
    }
    Ok(())
}

/// Checks a snapshot request against the call's sequences (`len(s)` tokens each, `n` of them)
/// and the configuration.
pub(super) fn validate(
    cfg: &KdaConfig,
    snaps: &Snapshots<'_>,
    n: usize,
    len: impl Fn(usize) -> usize,
) -> Result<(), KdaError> {
    let bad = |reason| {
        Err(KdaError::Config {
            field: "snapshots",
            reason,
        })
    };
    for (i, p) in snaps.at.iter().enumerate() {
        if p.seq >= n {
            return bad("a sequence index is past the last sequence");
        }
        if p.pos == 0 || p.pos > len(p.seq) {
            return bad("a position is not between 1 and its sequence's length");
        }
        if i > 0 && snaps.at[i - 1] >= *p {
            return bad("positions must be sorted by sequence then position, without repeats");
        }
    }
    snaps.states.validate(cfg, snaps.at.len())
}

/// The snapshots of one sequence that fall in rows `(lo, hi]` of it: their global indices and
/// positions.
#[derive(Debug, Clone, Copy)]
pub(super) struct SnapsIn<'a> {
    /// Index in the call's list of the first one.
    pub(super) first: usize,
    /// Their positions (sequence-relative), increasing.
    pub(super) at: &'a [SnapshotPos],
}

/// The snapshots of sequence `seq` in rows `(lo, hi]` of it.
pub(super) fn snaps_in(at: &[SnapshotPos], seq: usize, lo: usize, hi: usize) -> SnapsIn<'_> {
    let first = at.partition_point(|p| (p.seq, p.pos) <= (seq, lo));
    let end = at.partition_point(|p| (p.seq, p.pos) <= (seq, hi));
    SnapsIn {
        first,
        at: &at[first..end],
    }
}

/// The last snapshot position of sequence `seq` at or before row `t` of it (0 if none): where
/// its chunk grid starts.
pub(super) fn grid_origin(at: &[SnapshotPos], seq: usize, t: usize) -> usize {
    let i = at.partition_point(|p| (p.seq, p.pos) <= (seq, t));
    match i.checked_sub(1).map(|j| at[j]) {
        Some(p) if p.seq == seq => p.pos,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    fn pos(seq: usize, pos: usize) -> SnapshotPos {
        SnapshotPos { seq, pos }
    }

    #[test]
    fn every_s_lists_whole_multiples_in_order() {
        let cu = [0usize, 130, 130, 194, 250];
        // 130 → 64, 128; 0 → none; 64 → 64; 56 → none.
        assert_eq!(snapshot_count(&cu, 64).unwrap(), 3);
        let mut out = vec![pos(9, 9); 3];
        snapshot_positions(&cu, 64, &mut out).unwrap();
        assert_eq!(out, [pos(0, 64), pos(0, 128), pos(2, 64)]);
        assert!(snapshot_count(&cu, 0).is_err());
        assert!(snapshot_positions(&cu, 64, &mut out[..2]).is_err());
    }

    #[test]
    fn lookups_by_sequence_and_rows() {
        let at = [pos(0, 16), pos(0, 32), pos(2, 5), pos(2, 64)];
        let s = snaps_in(&at, 0, 0, 16);
        assert_eq!((s.first, s.at.len()), (0, 1));
        let s = snaps_in(&at, 0, 16, 100);
        assert_eq!((s.first, s.at), (1, &at[1..2]));
        let s = snaps_in(&at, 1, 0, 100);
        assert!(s.at.is_empty());
        let s = snaps_in(&at, 2, 4, 64);
        assert_eq!((s.first, s.at.len()), (2, 2));
        assert_eq!(grid_origin(&at, 0, 15), 0);
        assert_eq!(grid_origin(&at, 0, 16), 16);
        assert_eq!(grid_origin(&at, 0, 40), 32);
        assert_eq!(grid_origin(&at, 1, 40), 0);
        assert_eq!(grid_origin(&at, 2, 63), 5);
    }
}
