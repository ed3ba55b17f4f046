//! LoRA adapters over the frozen base: low-rank deltas on the attention and MLP projections,
//! saved and loaded in PEFT's on-disk format so vLLM, SGLang and `peft` read what we write.
//!
//! An adapter owns its parameters in a `VarStore` (what the optimizer steps); the base
//! model owns none of them. That is what lets one process hold several tenants' adapters
//! over one copy of the base weights: a forward pass is handed one adapter, or none.
//!
//! PEFT layout: `adapter_config.json` + `adapter_model.safetensors`, tensors
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` `[r, in]` and
//! `...lora_B.weight` `[out, r]`; the projection becomes `W x + (alpha / r) · B A dropout(x)`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::{nn, Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::json_file::{self, JsonFileError};

pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// What went wrong creating, loading or saving an adapter.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error(transparent)]
    ConfigFile(#[from] JsonFileError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serialise the adapter config for {path}: {source}")]
    Config {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("adapter option {option} = {value} is not supported")]
    Unsupported { option: &'static str, value: String },
    #[error("{0:?} is not a LoRA target module (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")]
    UnknownTarget(String),
    #[error("rank must be positive, got {0}")]
    Rank(i64),
    #[error("cannot read adapter tensors from {path}: {source}")]
    Tensors {
        path: String,
        #[source]
        source: tch::TchError,
    },
    #[error("cannot write adapter tensors to {path}: {source}")]
    Serialize {
        path: String,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("the adapter has no tensor {0}")]
    Missing(String),
    #[error("the adapter has tensor {0}, which is not a LoRA weight of this model")]
    Unexpected(String),
    #[error("adapter tensor {name} has shape {got:?}, the model implies {want:?}")]
    Shape {
        name: String,
        got: Vec<i64>,
        want: Vec<i64>,
    },
    #[error("no adapter named {0:?} is registered")]
    NotRegistered(String),
}

/// A projection a LoRA delta can sit on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Target {
    #[serde(rename = "q_proj")]
    Q,
    #[serde(rename = "k_proj")]
    K,
    #[serde(rename = "v_proj")]
    V,
    #[serde(rename = "o_proj")]
    O,
    #[serde(rename = "gate_proj")]
    Gate,
    #[serde(rename = "up_proj")]
    Up,
    #[serde(rename = "down_proj")]
    Down,
}

impl Target {
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The module's name in HF checkpoints and PEFT's `target_modules`.
    pub fn module_name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// `self_attn` or `mlp`: the block the module sits in.
    pub fn block(self) -> &'static str {
        match self {
            Target::Q | Target::K | Target::V | Target::O => "self_attn",
            Target::Gate | Target::Up | Target::Down => "mlp",
        }
    }

    pub fn from_module_name(name: &str) -> Result<Self, LoraError> {
        Target::ALL
            .into_iter()
            .find(|t| t.module_name() == name)
            .ok_or_else(|| LoraError::UnknownTarget(name.to_owned()))
    }

    /// `[in, out]` features of this projection in a model of `config`.
    pub fn dims(self, config: &ModelConfig) -> (i64, i64) {
        let q_out = config.num_heads * config.head_dim;
        let kv_out = config.num_kv_heads * config.head_dim;
        match self {
            Target::Q => (config.hidden_size, q_out),
            Target::K | Target::V => (config.hidden_size, kv_out),
            Target::O => (q_out, config.hidden_size),
            Target::Gate | Target::Up => (config.hidden_size, config.intermediate_size),
            Target::Down => (config.intermediate_size, config.hidden_size),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The shape of an adapter: which projections it touches and how strongly.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: i64,
    pub alpha: f64,
    /// Applied to the delta's input while training, as PEFT does.
    pub dropout: f64,
    pub targets: Vec<Target>,
    /// rsLoRA scales by alpha / sqrt(r) instead of alpha / r.
    pub use_rslora: bool,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: Target::ALL.to_vec(),
            use_rslora: false,
        }
    }
}

impl LoraConfig {
    /// The factor on B·A.
    pub fn scaling(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }
}

/// PEFT's `adapter_config.json`: the fields we write, and the ones we must check on read.
#[derive(Debug, Serialize, Deserialize)]
struct PeftConfig {
    #[serde(default = "lora_type")]
    peft_type: String,
    #[serde(default)]
    task_type: Option<String>,
    r: i64,
    lora_alpha: f64,
    #[serde(default)]
    lora_dropout: f64,
    target_modules: Value,
    #[serde(default = "bias_none")]
    bias: String,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
    #[serde(default)]
    inference_mode: bool,
    #[serde(default)]
    modules_to_save: Option<Value>,
    #[serde(default)]
    layers_to_transform: Option<Value>,
    #[serde(default)]
    rank_pattern: BTreeMap<String, Value>,
    #[serde(default)]
    alpha_pattern: BTreeMap<String, Value>,
    #[serde(default = "init_true")]
    init_lora_weights: Value,
    /// Newer PEFT options we do not implement; each must be absent, null, false or empty.
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// PEFT options that change the computation; an adapter that sets one is refused rather
/// than served with a different delta than the one it was trained with.
const MUST_BE_OFF: [&str; 7] = [
    "lora_bias",
    "use_qalora",
    "layer_replication",
    "trainable_token_indices",
    "target_parameters",
    "exclude_modules",
    "alora_invocation_tokens",
];

fn lora_type() -> String {
    "LORA".to_owned()
}
fn bias_none() -> String {
    "none".to_owned()
}
fn init_true() -> Value {
    Value::Bool(true)
}

impl PeftConfig {
    fn to_lora_config(&self) -> Result<LoraConfig, LoraError> {
        let unsupported =
            |option: &'static str, value: String| Err(LoraError::Unsupported { option, value });
        if self.peft_type != "LORA" {
            return unsupported("peft_type", self.peft_type.clone());
        }
        if self.bias != "none" {
            return unsupported("bias", self.bias.clone());
        }
        if self.use_dora {
            return unsupported("use_dora", "true".to_owned());
        }
        if self.fan_in_fan_out {
            return unsupported("fan_in_fan_out", "true".to_owned());
        }
        if !self.rank_pattern.is_empty() || !self.alpha_pattern.is_empty() {
            return unsupported("rank_pattern/alpha_pattern", "non-empty".to_owned());
        }
        if matches!(&self.modules_to_save, Some(v) if !v.is_null()) {
            return unsupported("modules_to_save", "non-empty".to_owned());
        }
        if matches!(&self.layers_to_transform, Some(v) if !v.is_null()) {
            return unsupported("layers_to_transform", "non-empty".to_owned());
        }
        for option in MUST_BE_OFF {
            match self.other.get(option) {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                Some(Value::Array(a)) if a.is_empty() => {}
                Some(Value::Object(o)) if o.is_empty() => {}
                Some(v) => return unsupported(option, v.to_string()),
            }
        }
        let targets = match &self.target_modules {
            Value::String(s) if s == "all-linear" => Target::ALL.to_vec(),
            Value::Array(items) => {
                let mut targets = items
                    .iter()
                    .map(|v| match v.as_str() {
                        Some(name) => Target::from_module_name(name),
                        None => Err(LoraError::UnknownTarget(v.to_string())),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                targets.sort();
                targets.dedup();
                targets
            }
            other => return unsupported("target_modules", other.to_string()),
        };
        if self.r <= 0 {
            return Err(LoraError::Rank(self.r));
        }
        Ok(LoraConfig {
            rank: self.r,
            alpha: self.lora_alpha,
            dropout: self.lora_dropout,
            targets,
            use_rslora: self.use_rslora,
        })
    }

    fn from_lora_config(config: &LoraConfig, base_model: Option<&str>) -> Self {
        PeftConfig {
            peft_type: lora_type(),
            task_type: Some("CAUSAL_LM".to_owned()),
            r: config.rank,
            lora_alpha: config.alpha,
            lora_dropout: config.dropout,
            target_modules: Value::Array(
                config
                    .targets
                    .iter()
                    .map(|t| Value::String(t.module_name().to_owned()))
                    .collect(),
            ),
            bias: bias_none(),
            use_rslora: config.use_rslora,
            use_dora: false,
            fan_in_fan_out: false,
            base_model_name_or_path: base_model.map(str::to_owned),
            inference_mode: true,
            modules_to_save: None,
            layers_to_transform: None,
            rank_pattern: BTreeMap::new(),
            alpha_pattern: BTreeMap::new(),
            init_lora_weights: init_true(),
            other: BTreeMap::new(),
        }
    }
}

/// One projection's low-rank factors.
#[derive(Debug)]
pub struct LoraPair {
    /// `[r, in]`
    pub a: Tensor,
    /// `[out, r]`
    pub b: Tensor,
}

/// The PEFT tensor name of a factor (`"A"` or `"B"`) of `target` in layer `layer`.
pub fn peft_tensor_name(layer: i64, target: Target, factor: char) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.{}.lora_{factor}.weight",
        target.block(),
        target.module_name()
    )
}

/// A trainable set of LoRA factors for one base model.
pub struct LoraAdapter {
    config: LoraConfig,
    scaling: f64,
    vars: nn::VarStore,
    /// `layers[i][target.index()]`
    layers: Vec<[Option<LoraPair>; 7]>,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraAdapter")
            .field("config", &self.config)
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl LoraAdapter {
    /// A fresh adapter as PEFT initialises one: A ~ kaiming-uniform(a=√5), i.e.
    /// U(±1/√in), and B = 0, so that the adapted model starts equal to the base.
    /// Draws from torch's global generator: seed it with `tch::manual_seed`.
    pub fn new(model: &ModelConfig, config: LoraConfig, device: Device) -> Result<Self, LoraError> {
        if config.rank <= 0 {
            return Err(LoraError::Rank(config.rank));
        }
        Self::build(model, config, device, |_, target, factor, shape| {
            let (fan_in, _) = target.dims(model);
            Ok(match factor {
                'A' => {
                    let bound = 1.0 / (fan_in as f64).sqrt();
                    Tensor::rand(shape, (Kind::Float, device)) * (2.0 * bound) - bound
                }
                _ => Tensor::zeros(shape, (Kind::Float, device)),
            })
        })
    }

    /// Loads a PEFT adapter directory written by us, by `peft`, or by another trainer.
    pub fn load(dir: &Path, model: &ModelConfig, device: Device) -> Result<Self, LoraError> {
        let peft: PeftConfig = json_file::read(&dir.join(CONFIG_FILE))?;
        let config = peft.to_lora_config()?;

        let weights_path = dir.join(WEIGHTS_FILE);
        let mut tensors: HashMap<String, Tensor> = Tensor::read_safetensors(&weights_path)
            .map_err(|source| LoraError::Tensors {
                path: weights_path.display().to_string(),
                source,
            })?
            .into_iter()
            .collect();
        let adapter = Self::build(model, config, device, |layer, target, factor, shape| {
            let name = peft_tensor_name(layer, target, factor);
            let t = tensors
                .remove(&name)
                .ok_or_else(|| LoraError::Missing(name.clone()))?;
            if t.size() != shape {
                return Err(LoraError::Shape {
                    name,
                    got: t.size(),
                    want: shape.to_vec(),
                });
            }
            Ok(t.to_kind(Kind::Float).to_device(device))
        })?;
        // A tensor we would silently ignore is a delta the served model has and we do not.
        if let Some(name) = tensors.keys().min() {
            return Err(LoraError::Unexpected(name.clone()));
        }
        Ok(adapter)
    }

    /// Creates the adapter's variables, asking `init` for each factor's starting value.
    fn build(
        model: &ModelConfig,
        config: LoraConfig,
        device: Device,
        mut init: impl FnMut(i64, Target, char, &[i64]) -> Result<Tensor, LoraError>,
    ) -> Result<Self, LoraError> {
        let vars = nn::VarStore::new(device);
        let root = vars.root();
        let mut layers = Vec::with_capacity(model.num_layers as usize);
        for layer in 0..model.num_layers {
            let path = &root / "layers" / layer;
            let mut slots: [Option<LoraPair>; 7] = Default::default();
            for &target in &config.targets {
                let (fan_in, fan_out) = target.dims(model);
                let a = init(layer, target, 'A', &[config.rank, fan_in])?;
                let b = init(layer, target, 'B', &[fan_out, config.rank])?;
                let module = &path / target.module_name();
                slots[target.index()] = Some(LoraPair {
                    a: module.var_copy("lora_A", &a),
                    b: module.var_copy("lora_B", &b),
                });
            }
            layers.push(slots);
        }
        Ok(LoraAdapter {
            scaling: config.scaling(),
            config,
            vars,
            layers,
        })
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` into `dir`.
    pub fn save(&self, dir: &Path, base_model: Option<&str>) -> Result<(), LoraError> {
        std::fs::create_dir_all(dir).map_err(|source| LoraError::Write {
            path: dir.display().to_string(),
            source,
        })?;
        let config_path = dir.join(CONFIG_FILE);
        let peft = PeftConfig::from_lora_config(&self.config, base_model);
        let text = serde_json::to_string_pretty(&peft).map_err(|source| LoraError::Config {
            path: config_path.display().to_string(),
            source,
        })?;
        std::fs::write(&config_path, text).map_err(|source| LoraError::Write {
            path: config_path.display().to_string(),
            source,
        })?;

        let mut named = Vec::new();
        for (layer, slots) in self.layers.iter().enumerate() {
            for &target in &self.config.targets {
                if let Some(pair) = &slots[target.index()] {
                    for (factor, t) in [('A', &pair.a), ('B', &pair.b)] {
                        named.push((peft_tensor_name(layer as i64, target, factor), t));
                    }
                }
            }
        }
        let weights_path = dir.join(WEIGHTS_FILE);
        crate::safetensors_io::write(&named, &weights_path).map_err(|source| LoraError::Serialize {
            path: weights_path.display().to_string(),
            source,
        })
    }

    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The trainable variables, for an optimizer.
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vars
    }

    pub fn var_store_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vars
    }

    pub fn pair(&self, layer: usize, target: Target) -> Option<&LoraPair> {
        self.layers.get(layer)?[target.index()].as_ref()
    }

    /// `scaling · B A dropout(x)` for `target` in `layer`, or None where the adapter does
    /// not touch that projection. Computed in f32 whatever the base's dtype, then cast back.
    pub fn delta(&self, x: &Tensor, layer: usize, target: Target, train: bool) -> Option<Tensor> {
        let pair = self.pair(layer, target)?;
        let input = x.to_kind(Kind::Float);
        let input = if train && self.config.dropout > 0.0 {
            input.dropout(self.config.dropout, true)
        } else {
            input
        };
        let low = input.linear::<Tensor>(&pair.a, None);
        let out = low.linear::<Tensor>(&pair.b, None) * self.scaling;
        Some(out.to_kind(x.kind()))
    }
}

/// Several tenants' adapters over one frozen base, keyed by adapter name
/// (e.g. `tenant-a@v17`, the name the inference backend serves it under).
#[derive(Debug, Default)]
pub struct AdapterRegistry {
    adapters: HashMap<String, LoraAdapter>,
}

impl AdapterRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the adapter `name`, returning the one it replaced.
    pub fn insert(&mut self, name: impl Into<String>, adapter: LoraAdapter) -> Option<LoraAdapter> {
        self.adapters.insert(name.into(), adapter)
    }

    /// Loads a PEFT directory under `name`.
    pub fn load(
        &mut self,
        name: impl Into<String>,
        dir: &Path,
        model: &ModelConfig,
        device: Device,
    ) -> Result<(), LoraError> {
        let adapter = LoraAdapter::load(dir, model, device)?;
        self.insert(name, adapter);
        Ok(())
    }

    pub fn remove(&mut self, name: &str) -> Option<LoraAdapter> {
        self.adapters.remove(name)
    }

    pub fn get(&self, name: &str) -> Result<&LoraAdapter, LoraError> {
        self.adapters
            .get(name)
            .ok_or_else(|| LoraError::NotRegistered(name.to_owned()))
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut LoraAdapter, LoraError> {
        self.adapters
            .get_mut(name)
            .ok_or_else(|| LoraError::NotRegistered(name.to_owned()))
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.adapters.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{tiny_config, tiny_model};

    fn ids() -> Tensor {
        Tensor::from_slice(&[1i64, 7, 3, 42, 9, 0]).view([1, 6])
    }

    fn randomized(adapter: LoraAdapter) -> LoraAdapter {
        tch::no_grad(|| {
            for (_, mut var) in adapter.var_store().variables() {
                var.copy_(&(Tensor::randn(var.size(), (Kind::Float, Device::Cpu)) * 0.1));
            }
        });
        adapter
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn a_fresh_adapter_leaves_the_base_unchanged_because_b_starts_at_zero() {
        let model = tiny_model(1);
        let adapter = LoraAdapter::new(model.config(), LoraConfig::default(), Device::Cpu).unwrap();
        let base = model.forward(&ids(), None, false).unwrap();
        let adapted = model.forward(&ids(), Some(&adapter), false).unwrap();
        assert_eq!(max_diff(&base, &adapted), 0.0);
        // A is kaiming-uniform: within ±1/sqrt(fan_in) and not all zero.
        let a = &adapter.pair(0, Target::Q).unwrap().a;
        let bound = 1.0 / (model.config().hidden_size as f64).sqrt();
        assert!(a.abs().max().double_value(&[]) <= bound);
        assert!(a.abs().sum(Kind::Float).double_value(&[]) > 0.0);
    }

    #[test]
    fn the_delta_is_alpha_over_r_times_b_a_x() {
        let config = tiny_config();
        let lora = LoraConfig {
            rank: 2,
            alpha: 6.0,
            targets: vec![Target::V],
            ..LoraConfig::default()
        };
        let adapter = randomized(LoraAdapter::new(&config, lora, Device::Cpu).unwrap());
        let x = Tensor::randn([3, config.hidden_size], (Kind::Float, Device::Cpu));
        let pair = adapter.pair(1, Target::V).unwrap();
        let want = x.matmul(&pair.a.tr()).matmul(&pair.b.tr()) * 3.0;
        let got = adapter.delta(&x, 1, Target::V, false).unwrap();
        assert!(max_diff(&got, &want) < 1e-6);
        assert!(adapter.delta(&x, 1, Target::Q, false).is_none());
    }

    #[test]
    fn dropout_acts_only_while_training() {
        let config = tiny_config();
        let lora = LoraConfig {
            dropout: 0.5,
            ..LoraConfig::default()
        };
        let adapter = randomized(LoraAdapter::new(&config, lora, Device::Cpu).unwrap());
        let x = Tensor::ones([4, config.hidden_size], (Kind::Float, Device::Cpu));
        let eval_a = adapter.delta(&x, 0, Target::Up, false).unwrap();
        let eval_b = adapter.delta(&x, 0, Target::Up, false).unwrap();
        assert_eq!(max_diff(&eval_a, &eval_b), 0.0);
        let train = adapter.delta(&x, 0, Target::Up, true).unwrap();
        assert!(max_diff(&eval_a, &train) > 0.0);
    }

    #[test]
    fn a_saved_adapter_loads_back_with_the_same_factors_and_peft_config() {
        let model = tiny_model(2);
        let lora = LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.05,
            targets: vec![Target::Q, Target::Down],
            use_rslora: false,
        };
        let adapter =
            randomized(LoraAdapter::new(model.config(), lora.clone(), Device::Cpu).unwrap());
        let dir = std::env::temp_dir().join(format!("clawback-lora-{}", std::process::id()));
        adapter.save(&dir, Some("Qwen/Qwen2.5-0.5B")).unwrap();

        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(written["peft_type"], "LORA");
        assert_eq!(written["r"], 4);
        assert_eq!(written["lora_alpha"], 8.0);
        assert_eq!(written["bias"], "none");
        assert_eq!(
            written["target_modules"],
            serde_json::json!(["q_proj", "down_proj"])
        );
        let names: Vec<String> = Tensor::read_safetensors(dir.join(WEIGHTS_FILE))
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(names
            .contains(&"base_model.model.model.layers.1.mlp.down_proj.lora_B.weight".to_owned()));
        assert_eq!(names.len(), 2 * 2 * 2);

        let loaded = LoraAdapter::load(&dir, model.config(), Device::Cpu).unwrap();
        assert_eq!(loaded.config(), &lora);
        let a = model.forward(&ids(), Some(&adapter), false).unwrap();
        let b = model.forward(&ids(), Some(&loaded), false).unwrap();
        assert_eq!(max_diff(&a, &b), 0.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn peft_options_we_do_not_implement_are_refused_by_name() {
        let base = r#""r": 8, "lora_alpha": 16"#;
        for (extra, option) in [
            (
                r#""use_dora": true, "target_modules": ["q_proj"]"#,
                "use_dora",
            ),
            (
                r#""lora_bias": true, "target_modules": ["q_proj"]"#,
                "lora_bias",
            ),
            (r#""bias": "all", "target_modules": ["q_proj"]"#, "bias"),
            (r#""target_modules": "model.*q_proj""#, "target_modules"),
        ] {
            let peft: PeftConfig = serde_json::from_str(&format!("{{{base}, {extra}}}")).unwrap();
            match peft.to_lora_config() {
                Err(LoraError::Unsupported { option: o, .. }) => assert_eq!(o, option),
                other => panic!("{extra}: {other:?}"),
            }
        }
        let peft: PeftConfig =
            serde_json::from_str(r#"{"r": 8, "lora_alpha": 16, "target_modules": ["lm_head"]}"#)
                .unwrap();
        assert!(matches!(
            peft.to_lora_config(),
            Err(LoraError::UnknownTarget(_))
        ));
    }

    #[test]
    fn tenants_adapters_share_one_base_and_each_pass_picks_one_or_none() {
        let model = tiny_model(4);
        let mut registry = AdapterRegistry::new();
        for (name, seed) in [("tenant-a@v1", 10), ("tenant-b@v3", 11)] {
            tch::manual_seed(seed);
            let adapter =
                LoraAdapter::new(model.config(), LoraConfig::default(), Device::Cpu).unwrap();
            registry.insert(name, randomized(adapter));
        }
        assert_eq!(registry.names(), vec!["tenant-a@v1", "tenant-b@v3"]);
        let base = model.forward(&ids(), None, false).unwrap();
        let a = model
            .forward(&ids(), Some(registry.get("tenant-a@v1").unwrap()), false)
            .unwrap();
        let b = model
            .forward(&ids(), Some(registry.get("tenant-b@v3").unwrap()), false)
            .unwrap();
        assert!(
            max_diff(&a, &base) > 1e-3 && max_diff(&b, &base) > 1e-3 && max_diff(&a, &b) > 1e-3
        );
        // The base is untouched by either adapter.
        assert_eq!(
            max_diff(&model.forward(&ids(), None, false).unwrap(), &base),
            0.0
        );
        assert!(registry.remove("tenant-a@v1").is_some());
        assert!(matches!(
            registry.get("tenant-a@v1"),
            Err(LoraError::NotRegistered(_))
        ));
    }
}
