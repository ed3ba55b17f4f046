//! Keys and values of the positions a generation has already run, per layer, so that
//! each new token costs one position's forward pass instead of the whole sequence's.

use tch::Tensor;

/// The cache of one sequence (or one batch of sequences of equal length).
#[derive(Debug)]
pub struct KvCache {
    /// Per layer: keys and values `[batch, kv_heads, positions, head_dim]`.
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: i64,
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| None).collect(),
            len: 0,
        }
    }

    /// Positions already cached.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Appends the new positions' keys and values of `layer` and returns the whole
    /// sequence's. The cache's length moves only in [`KvCache::advance`], once every
    /// layer has appended.
    pub(crate) fn append(&mut self, layer: usize, k: Tensor, v: Tensor) -> (Tensor, Tensor) {
        let (k, v) = match self.layers[layer].take() {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
            None => (k, v),
        };
        self.layers[layer] = Some((k.shallow_clone(), v.shallow_clone()));
        (k, v)
    }

    pub(crate) fn advance(&mut self, positions: i64) {
        self.len += positions;
    }
}
