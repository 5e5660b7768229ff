//! What one rank of a sharded (`fsdp`) run stores, read from the program the pass rewrote:
//! each bucket's flat shard instead of the parameters in it, with the optimizer state of that
//! shard only. A rank's *local* list is the plain program's parameters (an empty placeholder
//! where one is sharded, the tensor itself where not: frozen, unused, buffers) followed by one
//! shard per bucket; the optimizer steps over that list, so the padding at a bucket's end
//! (zeros, with zero gradients) stays zero and is cut off before it reaches a parameter.
//!
//! Checkpoints and reports hold whole tensors: [`ShardLayout::unshard`] puts the gathered
//! buckets back into parameters, so a checkpoint loads at any world size, sharded or not.

use crate::exec::executor::RValue;
use crate::tensor::Tensor;
use crate::train::model::Model;
use tracepass_ir::{DType, Program};

/// One bucket of sharded parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketLayout {
    /// Its name (`b0`).
    pub name: String,
    /// Its shard's position among the rewritten forward's arguments.
    pub forward_arg: usize,
    /// Its gradient shard's position among the rewritten backward's results (`None`: frozen).
    pub grad_output: Option<usize>,
    /// Its tensors in layout order: (the parameter that holds the tensor's optimizer state,
    /// offset, elements). A tie is one member, its primary.
    pub members: Vec<(usize, usize, usize)>,
    /// Elements of the members together, and the zeros after them.
    pub numel: usize,
    pub padding: usize,
    pub dtype: DType,
}

/// Where every parameter of a sharded run lives.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardLayout {
    pub world_size: usize,
    pub buckets: Vec<BucketLayout>,
    /// Per parameter of the plain program: `(bucket, offset)` when sharded.
    pub place: Vec<Option<(usize, usize)>>,
    pub shapes: Vec<Vec<usize>>,
    pub dtypes: Vec<DType>,
    /// Per parameter: its rewritten forward argument and backward result (unsharded ones).
    pub forward_arg: Vec<usize>,
    pub grad_output: Vec<Option<usize>>,
    /// Per data argument of the model: its position among the rewritten forward's arguments.
    pub data_pos: Vec<usize>,
    /// The rewritten forward's argument count.
    pub forward_args: usize,
}

impl BucketLayout {
    /// Elements of one rank's shard.
    pub fn shard_numel(&self, world: usize) -> usize {
        (self.numel + self.padding) / world.max(1)
    }
}

impl ShardLayout {
    /// The layout of `sharded` (the model's program after `fsdp`); `None` when nothing in it
    /// is sharded.
    pub fn of(model: &Model, sharded: &Program) -> Result<Option<ShardLayout>, String> {
        let params = &sharded.params;
        if params.len() != model.program.params.len() {
            return Err(format!(
                "the rewritten program has {} parameters, the model {}",
                params.len(),
                model.program.params.len()
            ));
        }
        let mut buckets: Vec<BucketLayout> = Vec::new();
        let mut place = Vec::with_capacity(params.len());
        let mut world = None;
        for (i, p) in params.iter().enumerate() {
            let Some(sh) = &p.shard else {
                place.push(None);
                continue;
            };
            if sh.world_size == 0 || (sh.bucket_numel + sh.padding) % sh.world_size != 0 {
                return Err(format!(
                    "`{}`: bucket {} of {} + {} elements does not split {} ways",
                    p.fqn, sh.bucket, sh.bucket_numel, sh.padding, sh.world_size
                ));
            }
            if *world.get_or_insert(sh.world_size) != sh.world_size {
                return Err(format!("`{}` is sharded another number of ways", p.fqn));
            }
            let bi = match buckets.iter().position(|b| b.name == sh.bucket) {
                Some(bi) => bi,
                None => {
                    buckets.push(BucketLayout {
                        name: sh.bucket.clone(),
                        forward_arg: p.forward_arg,
                        grad_output: None,
                        members: Vec::new(),
                        numel: sh.bucket_numel,
                        padding: sh.padding,
                        dtype: p.dtype,
                    });
                    buckets.len() - 1
                }
            };
            let b = &mut buckets[bi];
            if b.forward_arg != p.forward_arg || b.numel != sh.bucket_numel || b.dtype != p.dtype {
                return Err(format!(
                    "`{}` disagrees with the other members of bucket {} on its argument, size or dtype",
                    p.fqn, sh.bucket
                ));
            }
            b.grad_output = b.grad_output.or(p.grad_output);
            // a tie's members share an offset; the primary (tied to none) keeps the state
            match b.members.iter_mut().find(|m| m.1 == sh.offset) {
                Some(m) if p.tied_to.is_none() => m.0 = i,
                Some(_) => {}
                None => b.members.push((i, sh.offset, sh.numel)),
            }
            place.push(Some((bi, sh.offset)));
        }
        let Some(world_size) = world else {
            return Ok(None);
        };
        buckets.sort_by_key(|b| b.forward_arg);
        // the places name buckets by their index before sorting: renumber
        let names: Vec<String> = params
            .iter()
            .map(|p| p.shard.as_ref().map_or(String::new(), |s| s.bucket.clone()))
            .collect();
        for (i, pl) in place.iter_mut().enumerate() {
            if let Some((bi, _)) = pl {
                *bi = buckets
                    .iter()
                    .position(|b| b.name == names[i])
                    .ok_or("internal: a bucket was lost")?;
            }
        }
        for b in &mut buckets {
            b.members.sort_by_key(|m| m.1);
        }
        let fwd = &sharded.forward;
        let data_pos = model
            .data_args
            .iter()
            .map(|d| {
                fwd.args()
                    .iter()
                    .position(|a| fwd.name(*a) == d.name)
                    .ok_or_else(|| format!("the rewritten forward lost data argument `{}`", d.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(Some(ShardLayout {
            world_size,
            buckets,
            place,
            shapes: params.iter().map(|p| p.shape.clone()).collect(),
            dtypes: params.iter().map(|p| p.dtype).collect(),
            forward_arg: params.iter().map(|p| p.forward_arg).collect(),
            grad_output: params.iter().map(|p| p.grad_output).collect(),
            data_pos,
            forward_args: fwd.args().len(),
        }))
    }

    fn params(&self) -> usize {
        self.place.len()
    }

    /// A bucket's padded whole, from one flat part per member (in member order).
    fn padded(b: &BucketLayout, parts: &[Tensor]) -> Result<Tensor, String> {
        let mut all = parts.to_vec();
        if b.padding > 0 {
            all.push(
                Tensor::zeros(vec![b.padding], b.dtype)
                    .ok_or_else(|| format!("bucket {}: no {} tensors", b.name, b.dtype))?,
            );
        }
        Tensor::cat_flat(&all).ok_or_else(|| {
            format!(
                "bucket {}: its members differ in dtype from {}",
                b.name, b.dtype
            )
        })
    }

    /// Rank `rank`'s local list of `full` (one tensor per parameter).
    pub fn shard_params(&self, full: &[Tensor], rank: usize) -> Result<Vec<Tensor>, String> {
        let mut local: Vec<Tensor> = Vec::with_capacity(self.params() + self.buckets.len());
        for (j, t) in full.iter().enumerate() {
            local.push(match self.place.get(j).copied().flatten() {
                Some(_) => Tensor::zeros(vec![0], t.dtype()).unwrap_or_else(|| t.clone()),
                None => t.clone(),
            });
        }
        for b in &self.buckets {
            let parts: Vec<Tensor> = b
                .members
                .iter()
                .map(|m| {
                    full[m.0]
                        .to_dtype(b.dtype)
                        .unwrap_or_else(|| full[m.0].clone())
                })
                .collect();
            let whole = Self::padded(b, &parts)?;
            let n = b.shard_numel(self.world_size);
            local.push(
                whole
                    .flat_range(rank * n, n)
                    .ok_or_else(|| format!("bucket {}: no shard {rank}", b.name))?,
            );
        }
        Ok(local)
    }

    /// Rank `rank`'s local list of optimizer moments, from one per parameter (a
    /// checkpoint's); a parameter without state contributes zeros.
    pub fn shard_moments(&self, full: &[Vec<f32>], rank: usize) -> Vec<Vec<f32>> {
        let mut local: Vec<Vec<f32>> = (0..self.params())
            .map(|j| match self.place[j] {
                Some(_) => Vec::new(),
                None => full.get(j).cloned().unwrap_or_default(),
            })
            .collect();
        for b in &self.buckets {
            let mut whole: Vec<f32> = Vec::with_capacity(b.numel + b.padding);
            for &(i, _, numel) in &b.members {
                match full.get(i) {
                    Some(m) if m.len() == numel => whole.extend_from_slice(m),
                    _ => whole.extend(std::iter::repeat_n(0.0, numel)),
                }
            }
            whole.resize(b.numel + b.padding, 0.0);
            let n = b.shard_numel(self.world_size);
            local.push(whole[rank * n..(rank + 1) * n].to_vec());
        }
        local
    }

    /// Which local entries keep no optimizer state: the parameters `unused` marks, never a
    /// shard.
    pub fn local_mask(&self, unused: &[bool]) -> Vec<bool> {
        let mut m = unused.to_vec();
        m.resize(self.params() + self.buckets.len(), false);
        m
    }

    /// Names of the local entries: the parameters', then `shard_<bucket>`.
    pub fn local_names(&self, model: &Model) -> Vec<String> {
        let mut names = model.param_names();
        names.extend(self.buckets.iter().map(|b| format!("shard_{}", b.name)));
        names
    }

    /// The rewritten forward's arguments: the data, the unsharded parameters, the shards.
    pub fn forward_inputs<T: Clone>(
        &self,
        data: impl IntoIterator<Item = T>,
        local: &[T],
    ) -> Vec<RValue<T>> {
        let mut inputs = Vec::new();
        self.forward_inputs_into(data, local, &mut inputs);
        inputs
    }

    /// [`ShardLayout::forward_inputs`] into `inputs` (emptied first: a list kept from step to
    /// step).
    pub fn forward_inputs_into<T: Clone>(
        &self,
        data: impl IntoIterator<Item = T>,
        local: &[T],
        inputs: &mut Vec<RValue<T>>,
    ) {
        inputs.clear();
        inputs.resize(self.forward_args, RValue::None);
        for (&pos, t) in self.data_pos.iter().zip(data) {
            inputs[pos] = RValue::Tensor(t);
        }
        for (j, t) in local.iter().enumerate().take(self.params()) {
            if self.place[j].is_none() {
                if let Some(slot) = inputs.get_mut(self.forward_arg[j]) {
                    *slot = RValue::Tensor(t.clone());
                }
            }
        }
        for (b, t) in self
            .buckets
            .iter()
            .zip(&local[self.params().min(local.len())..])
        {
            if let Some(slot) = inputs.get_mut(b.forward_arg) {
                *slot = RValue::Tensor(t.clone());
            }
        }
    }

    /// The local gradients among the rewritten backward's results: the unsharded
    /// parameters' own, then each bucket's shard (`None`: no gradient).
    pub fn local_grads<T: Clone>(&self, results: &[RValue<T>]) -> Vec<Option<T>> {
        let mut g = Vec::new();
        self.local_grads_into(results, &mut g);
        g
    }

    /// [`ShardLayout::local_grads`] into `g` (emptied first: a list kept from step to step).
    pub fn local_grads_into<T: Clone>(&self, results: &[RValue<T>], g: &mut Vec<Option<T>>) {
        let at = |k: Option<usize>| {
            k.and_then(|k| results.get(k).cloned())
                .and_then(RValue::tensor)
        };
        g.clear();
        g.extend((0..self.params()).map(|j| match self.place[j] {
            Some(_) => None,
            None => at(self.grad_output[j]),
        }));
        g.extend(self.buckets.iter().map(|b| at(b.grad_output)));
    }

    /// Whole parameters from the local list and every bucket's gathered padded whole.
    pub fn unshard(&self, local: &[Tensor], gathered: &[Tensor]) -> Result<Vec<Tensor>, String> {
        (0..self.params())
            .map(|j| match self.place[j] {
                None => Ok(local[j].clone()),
                Some((bi, offset)) => {
                    let numel: usize = self.shapes[j].iter().product();
                    gathered
                        .get(bi)
                        .and_then(|w| w.flat_range(offset, numel))
                        .ok_or_else(|| format!("bucket {bi} holds no parameter {j}"))?
                        .reshape(self.shapes[j].clone())
                }
            })
            .collect()
    }

    /// Whole moments (one per parameter) from the local ones and every bucket's gathered
    /// moments: a sharded tensor's state is its primary's; a tie's other members keep none
    /// of their own (zeros, as an unsharded run keeps them).
    pub fn unshard_moments(&self, local: &[Vec<f32>], gathered: &[Vec<f32>]) -> Vec<Vec<f32>> {
        (0..self.params())
            .map(|j| match self.place[j] {
                None => local.get(j).cloned().unwrap_or_default(),
                Some((bi, offset)) => {
                    let numel: usize = self.shapes[j].iter().product();
                    let primary = self.buckets[bi].members.iter().any(|m| m.0 == j);
                    match gathered.get(bi) {
                        Some(w) if primary && offset + numel <= w.len() => {
                            w[offset..offset + numel].to_vec()
                        }
                        _ => vec![0.0; numel],
                    }
                }
            })
            .collect()
    }

    /// The largest bucket gathered whole, in bytes (what a rank holds beyond its shards
    /// while a bucket is gathered).
    pub fn largest_bucket_bytes(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| (b.numel + b.padding) * b.dtype.size_bytes())
            .max()
            .unwrap_or(0)
    }
}
