//! Loading KDA layers from a Kimi Linear or Kimi K3 checkpoint folder, or from a Kimi Linear
//! GGUF file or split set ([`gguf::load`]).
//!
//! A checkpoint folder holds `config.json` and either `model.safetensors` or shards listed in
//! `model.safetensors.index.json` (`{"weight_map": {tensor: shard file}}`). Shards are
//! memory-mapped when first needed, so loading one layer of a large checkpoint touches only the
//! shards holding it; weights are then used in place (see [`layout`]).
//!
//! Every parsing step also works on bytes in memory ([`Checkpoint::from_memory`]), which is
//! what the fuzz targets drive.

pub mod config;
pub mod ct;
pub mod export;
pub mod gguf;
pub mod layout;
pub mod safetensors;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use self::config::{Layout, ModelConfig};
use self::ct::views::{GroupSpec, GroupViews, OwnedGroups};
use self::ct::CtConfig;
use self::gguf::index::GgufIndex;
use self::layout::{load_tensor, Dims, GateTensors, LayerTensors, Role, Src, WeightTensor};
use self::safetensors::{Buffer, SafetensorsFile};
use crate::error::{HostError, Result};
use crate::fsio;
use crate::log;
use crate::model::{Model, ModelLayer};

/// Name of the config file in a checkpoint folder.
pub const CONFIG_FILE: &str = "config.json";
/// Name of the single weights file.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

#[derive(Debug)]
enum Source {
    Dir(PathBuf),
    Memory(HashMap<String, Vec<u8>>),
    /// A GGUF file or split set: the paths of its files (none in memory).
    Gguf(Vec<PathBuf>),
}

/// A parsed shard index: tensor name → shard file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIndex {
    /// The `weight_map`.
    pub weight_map: HashMap<String, String>,
}

impl ShardIndex {
    /// Parses the bytes of `model.safetensors.index.json`; `file` names it in errors. Shard
    /// names must be plain file names (no folders, no `..`).
    pub fn parse(bytes: &[u8], file: &str) -> Result<Self> {
        let err = |reason: String| HostError::Config {
            file: file.to_string(),
            reason,
        };
        let v: Value =
            serde_json::from_slice(bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| err("lacks the `weight_map` object".into()))?;
        let mut weight_map = HashMap::with_capacity(map.len());
        for (k, v) in map {
            let shard = v
                .as_str()
                .ok_or_else(|| err(format!("`weight_map.{k}` is not a file name")))?;
            if shard.is_empty()
                || shard.contains(['/', '\\'])
                || shard == "."
                || shard == ".."
                || shard.contains('\0')
            {
                return Err(err(format!(
                    "`weight_map.{k}` names `{shard}`, which is not a file in the checkpoint folder"
                )));
            }
            weight_map.insert(k.clone(), shard.to_string());
        }
        Ok(ShardIndex { weight_map })
    }
}

/// A checkpoint whose config (and shard index) are parsed and whose weight files are opened on
/// demand. Turn it into a [`Model`] with [`Checkpoint::load`].
#[derive(Debug)]
pub struct Checkpoint {
    name: String,
    /// The model-level configuration.
    pub config: ModelConfig,
    source: Source,
    index: Option<ShardIndex>,
    files: Vec<SafetensorsFile>,
    opened: HashMap<String, usize>,
    /// compressed-tensors `quantization_config`, when there is one.
    quant: Option<CtConfig>,
    /// The quantised matrices loaded so far, in slot order.
    group_specs: Vec<GroupSpec>,
    /// The tensors of a GGUF checkpoint (whose files are then `files`, already opened).
    gguf: Option<GgufIndex>,
}

impl Checkpoint {
    /// Opens the checkpoint folder `dir` (reads `config.json` and the shard index, if any), or
    /// the GGUF file `dir` (a name ending in `.gguf`, or the GGUF magic) with the rest of its
    /// split set.
    pub fn open(dir: &Path) -> Result<Self> {
        let name = dir.display().to_string();
        match std::fs::metadata(dir) {
            Ok(md) if md.is_dir() => {}
            Ok(md) if md.is_file() && gguf::index::is_gguf(dir)? => return Self::open_gguf(dir),
            Ok(_) => {
                return Err(HostError::file(
                    &name,
                    "not a checkpoint folder (it is a file, and not a GGUF one; give the folder holding config.json, or a .gguf file)",
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(HostError::file(
                    &name,
                    "not a checkpoint folder (no such directory)",
                ))
            }
            Err(e) => return Err(HostError::io(dir, e)),
        }
        let cfg_path = dir.join(CONFIG_FILE);
        let cfg_bytes = fsio::read_regular(&cfg_path)?;
        let config = ModelConfig::parse(&cfg_bytes, &cfg_path.display().to_string())?;
        let quant = CtConfig::parse(&cfg_bytes, &cfg_path.display().to_string())?;
        let idx_path = dir.join(INDEX_FILE);
        let single = dir.join(SINGLE_FILE);
        let index = if idx_path.exists() {
            let b = fsio::read_regular(&idx_path)?;
            Some(ShardIndex::parse(&b, &idx_path.display().to_string())?)
        } else if single.exists() {
            fsio::regular_file(&single)?;
            None
        } else {
            return Err(HostError::file(
                &name,
                format!("has neither `{SINGLE_FILE}` nor `{INDEX_FILE}`"),
            ));
        };
        log::debug(format_args!(
            "{name}: {} layout, hidden {}, {} KDA layers, {}",
            config.layout.name(),
            config.hidden,
            config.kda_layers.len(),
            match &index {
                Some(i) => format!("sharded ({} tensors in the index)", i.weight_map.len()),
                None => "single file".to_string(),
            }
        ));
        Ok(Checkpoint {
            name,
            config,
            source: Source::Dir(dir.to_path_buf()),
            index,
            files: Vec::new(),
            opened: HashMap::new(),
            quant,
            group_specs: Vec::new(),
            gguf: None,
        })
    }

    /// A checkpoint held in memory: the bytes of `config.json`, of the shard index (if any),
    /// and of each weight file by name (`model.safetensors` when there is no index).
    pub fn from_memory(
        config: &[u8],
        index: Option<&[u8]>,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<Self> {
        let quant = CtConfig::parse(config, CONFIG_FILE)?;
        let config = ModelConfig::parse(config, CONFIG_FILE)?;
        let index = index
            .map(|b| ShardIndex::parse(b, INDEX_FILE))
            .transpose()?;
        Ok(Checkpoint {
            name: "<memory>".into(),
            config,
            source: Source::Memory(files.into_iter().collect()),
            index,
            files: Vec::new(),
            opened: HashMap::new(),
            quant,
            group_specs: Vec::new(),
            gguf: None,
        })
    }

    /// The files of the checkpoint on disk that a run may read: `config.json`, the shard index
    /// and every shard it names, or `model.safetensors` (empty for a checkpoint in memory).
    pub fn files_on_disk(&self) -> Vec<PathBuf> {
        let d = match &self.source {
            Source::Dir(d) => d,
            Source::Gguf(paths) => return paths.clone(),
            Source::Memory(_) => return Vec::new(),
        };
        let mut v = vec![d.join(CONFIG_FILE)];
        match &self.index {
            Some(ix) => {
                v.push(d.join(INDEX_FILE));
                let mut shards: Vec<&String> = ix.weight_map.values().collect();
                shards.sort();
                shards.dedup();
                v.extend(shards.into_iter().map(|s| d.join(s)));
            }
            None => v.push(d.join(SINGLE_FILE)),
        }
        v
    }

    /// The folder's (or GGUF file's) name, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for a GGUF file or split set.
    pub fn is_gguf(&self) -> bool {
        self.gguf.is_some()
    }

    /// The KDA layers (0-based, ascending) the checkpoint holds: every KDA layer of the config,
    /// except for a GGUF file that lists a subset in `kda.layers`.
    pub fn held_layers(&self) -> &[usize] {
        match &self.gguf {
            Some(g) => g.held(),
            None => &self.config.kda_layers,
        }
    }

    fn display(&self, file: &str) -> String {
        match &self.source {
            Source::Dir(d) => d.join(file).display().to_string(),
            Source::Memory(_) | Source::Gguf(_) => file.to_string(),
        }
    }

    /// Opens (maps and parses) weight file `shard` once; returns its number.
    fn open_file(&mut self, shard: &str) -> Result<usize> {
        if let Some(&i) = self.opened.get(shard) {
            return Ok(i);
        }
        let file = match &mut self.source {
            Source::Dir(d) => {
                let p = d.join(shard);
                log::debug(format_args!("mapping {}", p.display()));
                SafetensorsFile::map(&p)?
            }
            Source::Gguf(_) => {
                return Err(HostError::file(
                    shard,
                    "internal: a GGUF checkpoint has no safetensors files",
                ))
            }
            Source::Memory(m) => {
                let bytes = m
                    .remove(shard)
                    .ok_or_else(|| HostError::file(shard, "no such file in the checkpoint"))?;
                SafetensorsFile::parse(shard, Buffer::Owned(bytes))?
            }
        };
        self.files.push(file);
        self.opened.insert(shard.to_string(), self.files.len() - 1);
        Ok(self.files.len() - 1)
    }

    /// The file that should hold tensor `name`, if any.
    fn shard_of(&self, name: &str) -> Option<String> {
        match &self.index {
            Some(ix) => ix.weight_map.get(name).cloned(),
            None => Some(SINGLE_FILE.to_string()),
        }
    }

    /// Looks `name` up: `Some(file number)` when the checkpoint has it.
    fn find(&mut self, name: &str) -> Result<Option<usize>> {
        let Some(shard) = self.shard_of(name) else {
            return Ok(None);
        };
        let id = self.open_file(&shard)?;
        if self.files[id].get(name).is_some() {
            Ok(Some(id))
        } else if self.index.is_some() {
            Err(HostError::MissingTensor {
                file: self.files[id].name.clone(),
                tensor: name.to_string(),
                note: format!(" (the index `{INDEX_FILE}` places it in this file)"),
            })
        } else {
            Ok(None)
        }
    }

    /// Where missing tensors are reported: the index, or the single file.
    fn missing_in(&self) -> String {
        self.display(if self.index.is_some() {
            INDEX_FILE
        } else {
            SINGLE_FILE
        })
    }

    /// Finds `suffix` under any of `prefixes` (the layout's own first); errors name the first
    /// candidate, and say when only a quantised form (`weight_packed`) is present.
    fn resolve(&mut self, prefixes: &[String], suffix: &str) -> Result<(usize, String)> {
        for p in prefixes {
            let name = format!("{p}{suffix}");
            if let Some(id) = self.find(&name)? {
                return Ok((id, name));
            }
        }
        if let Some(base) = suffix.strip_suffix(".weight") {
            for p in prefixes {
                let packed = format!("{p}{base}.weight_packed");
                if self.find(&packed)?.is_some() {
                    return Err(HostError::Unsupported {
                        file: self.missing_in(),
                        tensor: packed,
                        reason: "is quantised (compressed-tensors `weight_packed`, no plain `.weight`), but config.json has no compressed-tensors `quantization_config` describing it".into(),
                    });
                }
            }
        }
        Err(HostError::MissingTensor {
            file: self.missing_in(),
            tensor: format!("{}{suffix}", prefixes[0]),
            note: String::new(),
        })
    }

    /// Candidate name prefixes for layer `layer`: the layout's own, then the other layout's
    /// (some exports strip or add `language_model.`).
    fn prefixes(&self, layer: usize) -> Vec<String> {
        let own = self.config.layout;
        let other = match own {
            Layout::KimiLinear => Layout::KimiK3,
            Layout::KimiK3 => Layout::KimiLinear,
        };
        [own, other]
            .iter()
            .map(|l| format!("{}self_attn.", l.layer_prefix(layer)))
            .collect()
    }

    fn tensor(
        &mut self,
        prefixes: &[String],
        suffix: &str,
        role: Role,
        dims: &Dims,
    ) -> Result<WeightTensor> {
        let matrix = !matches!(role, Role::Conv | Role::ALog | Role::DtBias | Role::Norm);
        if matrix {
            if let Some(t) = self.quantised_matrix(prefixes, suffix, role, dims)? {
                return Ok(t);
            }
        }
        let (id, name) = self.resolve(prefixes, suffix)?;
        load_tensor(&self.files[id], id, &name, role, dims)
    }

    fn low_rank(
        &mut self,
        p: &[String],
        down: &str,
        up: &str,
        dims: &Dims,
    ) -> Result<(GateTensors, usize)> {
        let a = self.tensor(p, down, Role::Down, dims)?;
        let rank = a.shape[0];
        let b = self.tensor(p, up, Role::Up(rank), dims)?;
        Ok((GateTensors::LowRank(a, b), rank))
    }

    /// The output gate of the layer with tensor prefixes `p`: full rank or low rank as the
    /// config says, with a hint at the config flag when the checkpoint has the other form.
    fn output_gate(&mut self, p: &[String], dims: &Dims) -> Result<(GateTensors, usize)> {
        let full_rank = self.config.full_rank_gate;
        let gate = if full_rank {
            self.tensor(p, "g_proj.weight", Role::ProjIn, dims)
                .map(|g| (GateTensors::FullRank(g), 0))
        } else {
            self.low_rank(p, "g_a_proj.weight", "g_b_proj.weight", dims)
        };
        match gate {
            Err(HostError::MissingTensor { file, tensor, note }) => {
                // Say which config flag would match the checkpoint.
                let alt = if full_rank {
                    "g_a_proj.weight"
                } else {
                    "g_proj.weight"
                };
                let has_alt = self.find(&format!("{}{alt}", p[0]))?.is_some();
                let note = if has_alt {
                    format!(
                        " (the checkpoint has `{alt}`: `use_full_rank_gate` in config.json should be {})",
                        !full_rank
                    )
                } else {
                    note
                };
                Err(HostError::MissingTensor { file, tensor, note })
            }
            other => other,
        }
    }

    /// The layer dimensions the config gives.
    fn dims(&self) -> Dims {
        let c = &self.config;
        Dims {
            hidden: c.hidden,
            heads: c.heads,
            head_dim: c.head_dim,
            conv_width: c.conv_width,
        }
    }

    /// Loads model layer `layer` (0-based; must be a KDA layer).
    fn load_layer(&mut self, layer: usize) -> Result<ModelLayer> {
        self.config.check_kda_layer(layer)?;
        if let Some(index) = &self.gguf {
            return self.load_gguf_layer(index, layer);
        }
        let dims = self.dims();
        let p = self.prefixes(layer);
        let qkv = [
            self.tensor(&p, "q_proj.weight", Role::ProjIn, &dims)?,
            self.tensor(&p, "k_proj.weight", Role::ProjIn, &dims)?,
            self.tensor(&p, "v_proj.weight", Role::ProjIn, &dims)?,
        ];
        let conv = [
            self.tensor(&p, "q_conv1d.weight", Role::Conv, &dims)?,
            self.tensor(&p, "k_conv1d.weight", Role::Conv, &dims)?,
            self.tensor(&p, "v_conv1d.weight", Role::Conv, &dims)?,
        ];
        let a_log = self.tensor(&p, "A_log", Role::ALog, &dims)?;
        let dt_bias = self.tensor(&p, "dt_bias", Role::DtBias, &dims)?;
        let (decay_proj, decay_rank) =
            self.low_rank(&p, "f_a_proj.weight", "f_b_proj.weight", &dims)?;
        let b_proj = self.tensor(&p, "b_proj.weight", Role::Beta, &dims)?;
        let (output_gate, out_rank) = self.output_gate(&p, &dims)?;
        let o_norm = self.tensor(&p, "o_norm.weight", Role::Norm, &dims)?;
        let o_proj = self.tensor(&p, "o_proj.weight", Role::ProjOut, &dims)?;
        let cfg = self.config.layer_config(decay_rank, out_rank);
        let tensors = LayerTensors {
            qkv,
            conv,
            a_log,
            dt_bias,
            decay_proj,
            b_proj,
            output_gate,
            o_norm,
            o_proj,
        };
        // Everything was checked tensor by tensor; this is the core's own check on top.
        let groups = GroupViews::build(&self.files, &self.group_specs)?;
        let src = Src {
            files: &self.files,
            groups: &groups,
        };
        tensors.weights(&cfg, src)?;
        log_placement(layer, &tensors);
        Ok(ModelLayer {
            index: layer,
            cfg,
            tensors,
        })
    }

    /// Loads KDA layers into a [`Model`]: the given model layers (0-based), or every KDA layer
    /// the checkpoint holds ([`Checkpoint::held_layers`]) when `layers` is `None`. A non-KDA
    /// layer is an error.
    pub fn load(mut self, layers: Option<&[usize]>) -> Result<Model> {
        let wanted: Vec<usize> = match layers {
            Some(l) => l.to_vec(),
            None => self.held_layers().to_vec(),
        };
        for &l in &wanted {
            self.config.check_kda_layer(l)?;
        }
        let mut loaded = Vec::with_capacity(wanted.len());
        for l in wanted {
            loaded.push(self.load_layer(l)?);
        }
        // SAFETY: the model keeps the files (moving them moves no mapped or heap bytes) for
        // as long as the views, never changes them, and lends the views only through `&self`.
        #[allow(unsafe_code)]
        let groups = unsafe { OwnedGroups::new(&self.files, self.group_specs) }?;
        Ok(Model::from_parts(self.name, self.config, self.files, loaded).with_groups(groups))
    }
}

/// Opening a model is reading its checkpoint: these constructors live beside the reader they
/// run, so that `model.rs` needs nothing of this file.
impl Model {
    /// Loads every KDA layer of the checkpoint folder `dir`, or of the GGUF file `dir` (with
    /// the rest of its split set).
    pub fn open(dir: &Path) -> Result<Self> {
        Checkpoint::open(dir)?.load(None)
    }

    /// Loads the given model layers (0-based; each must be a KDA layer) of `dir`.
    pub fn open_layers(dir: &Path, layers: &[usize]) -> Result<Self> {
        Checkpoint::open(dir)?.load(Some(layers))
    }
}

/// Logs (at debug level) how many of a layer's tensors are used in place and which were
/// copied.
fn log_placement(layer: usize, tensors: &LayerTensors) {
    let all = tensors.all();
    let copied: Vec<&str> = all
        .iter()
        .filter(|t| !t.in_place())
        .map(|t| t.name.as_str())
        .collect();
    log::debug(format_args!(
        "layer {layer}: {} tensors, {} in place, {} copied{}",
        all.len(),
        all.len() - copied.len(),
        copied.len(),
        if copied.is_empty() {
            String::new()
        } else {
            format!(" ({})", copied.join(", "))
        }
    ));
}
