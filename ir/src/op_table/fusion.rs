//! tracepass's own fusion region (`fuse-elementwise`): a statement whose body, printed below it
//! as decomposition comments, is what it computes (see [`crate::region`]).

use super::op;
use crate::meta::declared;
use crate::registry::DTypeRule::Meta;
use crate::registry::Effect::Pure;
use crate::registry::{ops, OpSpec};

const OPS: &[OpSpec] = &[op(ops::FUSION, &[], Pure, "*inputs", Meta, declared)];

pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
