//! The views a call's (sequence, head) tasks share and work on: the caches and snapshot
//! slots of the call, one task's piece of a block, and the rows and caches it owns.

use crate::cache::CachesMut;
use crate::exec::Shared;

use super::snapshot::{SnapsIn, SnapshotPos, Snapshots};

/// The snapshot buffers of a call, shared by the (sequence, head) tasks.
pub(super) struct SnapViews<'a> {
    pub(super) at: &'a [SnapshotPos],
    pub(super) caches: CacheViews<'a>,
}

impl<'a> SnapViews<'a> {
    pub(super) fn new(s: Snapshots<'a>) -> Self {
        SnapViews {
            at: s.at,
            caches: CacheViews::new(s.states),
        }
    }
}

/// The caches of a call (or its snapshots), shared by the (sequence, head) tasks.
pub(super) struct CacheViews<'a> {
    pub(super) states: Shared<'a>,
    pub(super) conv: [Shared<'a>; 3],
}

impl<'a> CacheViews<'a> {
    pub(super) fn new(c: CachesMut<'a>) -> Self {
        CacheViews {
            states: Shared::new(c.recurrent),
            conv: [
                Shared::new(c.conv_q),
                Shared::new(c.conv_k),
                Shared::new(c.conv_v),
            ],
        }
    }
}

/// One (sequence, head) piece of a block.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeqHead<'a> {
    /// Sequence index in the call.
    pub(super) seq: usize,
    pub(super) head: usize,
    /// First row of the sequence within the block, and its row count there.
    pub(super) row: usize,
    pub(super) len: usize,
    /// Rows of the sequence before this piece.
    pub(super) rel: usize,
    /// `(chunk size, length of the first chunk)` when the sequence runs chunked.
    pub(super) chunk: Option<(usize, usize)>,
    /// The snapshots that fall in this piece.
    pub(super) snaps: SnapsIn<'a>,
}

/// The views one task works on.
pub(super) struct Views<'a> {
    pub(super) q: &'a mut [f32],
    pub(super) k: &'a mut [f32],
    pub(super) v: &'a mut [f32],
    pub(super) decay: &'a mut [f32],
    pub(super) beta: &'a mut [f32],
    pub(super) state: &'a mut [f32],
    pub(super) conv: [&'a mut [f32]; 3],
    pub(super) scratch: &'a mut [f32],
}
