//! All KDA layers of a checkpoint, loaded together, and a per-sequence cache for them.

use kda_core::{
    ForwardOptions, InitialCaches, KdaConfig, KdaLayer, KdaWeights, Mode, Precision, SnapshotPos,
};

use crate::cache::SequenceCaches;
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::ct::views::OwnedGroups;
use crate::checkpoint::layout::{LayerTensors, Src};
use crate::checkpoint::safetensors::SafetensorsFile;
use crate::error::{HostError, Result};
use crate::panels::Panels;
use crate::runner::Runner;

/// One loaded KDA layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLayer {
    /// Model layer number, 0-based.
    pub index: usize,
    /// The core configuration.
    pub cfg: KdaConfig,
    /// Its tensors (in place in the mapped files, or copied).
    pub tensors: LayerTensors,
}

impl ModelLayer {
    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        self.tensors.all().iter().map(|t| t.bytes()).sum()
    }
}

/// The KDA layers of a checkpoint, over memory-mapped weight files.
#[derive(Debug)]
pub struct Model {
    name: String,
    config: ModelConfig,
    /// Views of the quantised matrices over `files` (declared first: dropped first).
    groups: OwnedGroups,
    files: Vec<SafetensorsFile>,
    layers: Vec<ModelLayer>,
    /// Panel-layout copies of each loaded layer's bf16 matrices, once
    /// [`Model::repack_panels`] has run (else empty).
    panels: Vec<Panels>,
    /// The projections' arithmetic of every call ([`Model::set_precision`]).
    precision: Precision,
}

// `Model::open` and `Model::open_layers` are in checkpoint/mod.rs, beside the reader they run.
impl Model {
    pub(crate) fn from_parts(
        name: String,
        config: ModelConfig,
        files: Vec<SafetensorsFile>,
        layers: Vec<ModelLayer>,
    ) -> Self {
        Model {
            name,
            config,
            groups: OwnedGroups::default(),
            files,
            layers,
            panels: Vec::new(),
            precision: Precision::Exact,
        }
    }

    /// The checkpoint folder, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model-level configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The loaded layers, ascending.
    pub fn layers(&self) -> &[ModelLayer] {
        &self.layers
    }

    /// The weight files opened.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// Loaded layer for model layer `index` (0-based).
    pub fn layer(&self, index: usize) -> Result<&ModelLayer> {
        match self.layers.iter().find(|l| l.index == index) {
            Some(l) => Ok(l),
            None => {
                self.config.check_kda_layer(index)?;
                Err(HostError::NotKda {
                    layer: index,
                    reason: "it was not loaded".into(),
                })
            }
        }
    }

    /// With the views of its quantised matrices (built over this model's files).
    pub(crate) fn with_groups(mut self, groups: OwnedGroups) -> Self {
        self.groups = groups;
        self
    }

    fn src(&self) -> Src<'_> {
        Src {
            files: &self.files,
            groups: self.groups.views(),
        }
    }

    /// The weights of model layer `index` for the core: borrowed from the mapped files, with
    /// the bf16 matrices in the panel layout after [`Model::repack_panels`].
    pub fn weights(&self, index: usize) -> Result<(&KdaConfig, KdaWeights<'_>)> {
        let l = self.layer(index)?;
        let base = l.tensors.weights(&l.cfg, self.src())?;
        let pos = self.layers.iter().position(|m| m.index == index);
        match pos.and_then(|p| self.panels.get(p)) {
            Some(p) => Ok((&l.cfg, p.weights(&base)?)),
            None => Ok((&l.cfg, base)),
        }
    }

    /// Repacks every loaded layer's bf16 matrices into the panel layout the CPU kernels
    /// stream fastest (decode 1.5–1.9× on this project's test machine; results are bitwise
    /// the same). Costs one copy of those matrices in memory; the mapped originals stay
    /// mapped but are no longer read, so the OS can drop their pages.
    pub fn repack_panels(&mut self) -> Result<()> {
        if !self.panels.is_empty() {
            return Ok(());
        }
        let mut panels = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            panels.push(Panels::new(&l.tensors.weights(&l.cfg, self.src())?)?);
        }
        self.panels = panels;
        Ok(())
    }

    /// Sets the projections' arithmetic of every later call ([`Precision::Exact`] at first).
    /// [`Precision::Bf16`] needs the panel layout: call [`Model::repack_panels`] first.
    pub fn set_precision(&mut self, precision: Precision) -> Result<()> {
        if precision == Precision::Bf16 && !self.is_repacked() {
            return Err(HostError::Invalid(
                "bf16 precision needs the panel layout: call Model::repack_panels first".into(),
            ));
        }
        self.precision = precision;
        Ok(())
    }

    /// The projections' arithmetic ([`Model::set_precision`]).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether [`Model::repack_panels`] has run.
    pub fn is_repacked(&self) -> bool {
        !self.panels.is_empty()
    }

    /// Bytes of the loaded layers' weights.
    pub fn weight_bytes(&self) -> usize {
        self.layers.iter().map(ModelLayer::weight_bytes).sum()
    }

    /// A zeroed cache for `sequences` sequences, covering every loaded layer.
    pub fn new_cache(&self, sequences: usize) -> Result<ModelCache> {
        let layers = self
            .layers
            .iter()
            .map(|l| Ok((l.index, SequenceCaches::try_new(&l.cfg, sequences)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelCache { sequences, layers })
    }

    /// Model layer `index` as a validated core layer with options `opts` (build it once and
    /// pass it to [`Runner::forward`] / [`Runner::decode`] for many calls).
    pub fn kda_layer(&self, index: usize, opts: ForwardOptions) -> Result<KdaLayer<'_>> {
        let (cfg, w) = self.weights(index)?;
        Ok(KdaLayer::new(cfg, w, opts)?)
    }

    /// Model layer `index` in `mode`, with the model's precision ([`Model::set_precision`]).
    fn layer_for(&self, index: usize, mode: Mode) -> Result<KdaLayer<'_>> {
        let opts = ForwardOptions::default()
            .with_mode(mode)
            .with_precision(self.precision);
        self.kda_layer(index, opts)
    }

    /// Runs model layer `index` over packed sequences `x` `[T, hidden]`, continuing from (and
    /// updating) that layer's part of `cache`. Returns `[T, hidden]`.
    pub fn forward(
        &self,
        runner: &mut Runner,
        index: usize,
        x: &[f32],
        cu_seqlens: &[usize],
        cache: &mut ModelCache,
        mode: Mode,
    ) -> Result<Vec<f32>> {
        let layer = self.layer_for(index, mode)?;
        let caches = cache.layer_mut(index)?;
        runner.forward(&layer, x, cu_seqlens, caches, InitialCaches::Given)
    }

    /// One decode step of model layer `index` for every sequence of `cache`.
    pub fn decode(
        &self,
        runner: &mut Runner,
        index: usize,
        x: &[f32],
        cache: &mut ModelCache,
    ) -> Result<Vec<f32>> {
        let layer = self.layer_for(index, Mode::Recurrent)?;
        runner.decode(&layer, x, cache.layer_mut(index)?)
    }

    /// [`Model::forward`] that also keeps the caches of layer `index` after the tokens listed
    /// in `snapshots.at` (sorted by sequence then position) in `snapshots`; `(x, cu_seqlens)`
    /// are the packed sequences [`Model::forward`] takes.
    pub fn forward_with_snapshots(
        &self,
        runner: &mut Runner,
        index: usize,
        (x, cu_seqlens): (&[f32], &[usize]),
        cache: &mut ModelCache,
        mode: Mode,
        snapshots: &mut ModelSnapshots,
    ) -> Result<Vec<f32>> {
        let layer = self.layer_for(index, mode)?;
        let caches = cache.layer_mut(index)?;
        let at = &snapshots.at;
        let given = InitialCaches::Given;
        let (out, snaps) =
            runner.forward_with_snapshots(&layer, x, cu_seqlens, caches, given, at)?;
        snapshots.layers.retain(|(i, _)| *i != index);
        snapshots.layers.push((index, snaps));
        snapshots.layers.sort_by_key(|(i, _)| *i);
        Ok(out)
    }

    /// A speculative verify of `rollback.drafts` tokens per sequence through layer `index`
    /// (`x`: `[N·drafts, hidden]`); the layer's record goes into `rollback`, the cache is
    /// only read. Returns the outputs.
    pub fn verify(
        &self,
        runner: &mut Runner,
        index: usize,
        x: &[f32],
        cache: &mut ModelCache,
        rollback: &mut ModelRollback,
    ) -> Result<Vec<f32>> {
        let layer = self.layer_for(index, Mode::Recurrent)?;
        let (out, record) = runner.verify(&layer, x, rollback.drafts, cache.layer_mut(index)?)?;
        rollback.layers.retain(|(i, _)| *i != index);
        rollback.layers.push((index, record));
        Ok(out)
    }

    /// Commits the first `accepted[s]` drafts of each sequence in every layer `rollback`
    /// holds a record for, and empties it (a record serves one commit).
    pub fn commit(
        &self,
        runner: &mut Runner,
        rollback: &mut ModelRollback,
        accepted: &[usize],
        cache: &mut ModelCache,
    ) -> Result<()> {
        for (index, record) in &mut rollback.layers {
            let layer = self.layer_for(*index, Mode::Recurrent)?;
            let caches = cache.layer_mut(*index)?;
            runner.commit(&layer, record, rollback.drafts, accepted, caches)?;
        }
        rollback.layers.clear();
        Ok(())
    }
}

/// Snapshots of a model's caches: for each snapshot position (sorted by sequence then
/// position) and each layer run with [`Model::forward_with_snapshots`], that layer's caches of
/// the sequence after those tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSnapshots {
    /// The positions, `(sequence, tokens consumed)`.
    pub at: Vec<SnapshotPos>,
    /// `(model layer, M snapshots' caches)`, ascending by layer.
    pub layers: Vec<(usize, SequenceCaches)>,
}

impl ModelSnapshots {
    /// Snapshots at `at` (taken as each layer runs).
    pub fn new(at: Vec<SnapshotPos>) -> Self {
        ModelSnapshots {
            at,
            layers: Vec::new(),
        }
    }

    /// Snapshot `m` of every layer as a one-sequence [`ModelCache`], to resume from.
    pub fn cache(&self, m: usize) -> Result<ModelCache> {
        let layers = self
            .layers
            .iter()
            .map(|(i, c)| Ok((*i, c.sequence(m)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelCache {
            sequences: 1,
            layers,
        })
    }
}

/// The rollback records of a speculative verify, one per model layer verified.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRollback {
    /// Draft tokens per sequence.
    pub drafts: usize,
    /// `(model layer, record)`.
    pub layers: Vec<(usize, Vec<f32>)>,
}

impl ModelRollback {
    /// An empty record for `drafts` draft tokens per sequence.
    pub fn new(drafts: usize) -> Self {
        ModelRollback {
            drafts,
            layers: Vec::new(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|(_, r)| 4 * r.len()).sum()
    }
}

/// The conv and recurrent states of `N` sequences for every KDA layer of a model.
///
/// Create with [`Model::new_cache`]; clone to fork sequences (a prefix cache); reset to start
/// over; save to and restore from a safetensors file with [`ModelCache::save`] and
/// [`ModelCache::load`] (see [`crate::state_file`] for the format).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCache {
    /// Number of sequences.
    pub sequences: usize,
    /// `(model layer, caches)`, ascending by layer.
    pub layers: Vec<(usize, SequenceCaches)>,
}

impl ModelCache {
    /// Zeroes every layer's caches.
    pub fn reset(&mut self) {
        for (_, c) in &mut self.layers {
            c.reset();
        }
    }

    /// Zeroes sequence `n`'s caches in every layer (that sequence starts over; the others
    /// keep theirs).
    pub fn reset_sequence(&mut self, n: usize, model: &Model) -> Result<()> {
        if n >= self.sequences {
            return Err(HostError::Invalid(format!(
                "sequence {n} is past the cache's {} sequences",
                self.sequences
            )));
        }
        for (i, c) in &mut self.layers {
            let cfg = model.layer(*i)?.cfg;
            c.as_mut().reset_sequence(&cfg, n);
        }
        Ok(())
    }

    /// The caches of model layer `index`.
    pub fn layer(&self, index: usize) -> Result<&SequenceCaches> {
        self.layers
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, c)| c)
            .ok_or_else(|| HostError::Invalid(format!("the cache has no layer {index}")))
    }

    /// The caches of model layer `index`, mutable.
    pub fn layer_mut(&mut self, index: usize) -> Result<&mut SequenceCaches> {
        self.layers
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, c)| c)
            .ok_or_else(|| HostError::Invalid(format!("the cache has no layer {index}")))
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|(_, c)| c.bytes()).sum()
    }
}
