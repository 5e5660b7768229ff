//! Property tests: random valid traces survive text and binary round trips unchanged.

use proptest::prelude::*;
use tracepass_ir::*;

/// One step of a random trace: an op applied to earlier values (by index).
#[derive(Clone, Debug)]
enum Step {
    Unary(&'static str, usize),
    Binary(&'static str, usize, usize),
    Scalar(&'static str, usize, f64),
    Sum(usize, usize, bool),
    Permute(usize),
    Reshape(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let unary = prop::sample::select(vec![
        "ltorch.tanh",
        "ltorch.exp",
        "ltorch.neg",
        "prims.sigmoid",
        "ltorch.abs",
    ]);
    let binary = prop::sample::select(vec![
        "ltorch.add",
        "ltorch.mul",
        "prims.sub",
        "ltorch.true_divide",
        "ltorch.maximum",
    ]);
    prop_oneof![
        (unary, any::<usize>()).prop_map(|(o, a)| Step::Unary(o, a)),
        (binary.clone(), any::<usize>(), any::<usize>())
            .prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        (binary, any::<usize>(), -1e6f64..1e6).prop_map(|(o, a, x)| Step::Scalar(o, a, x)),
        (any::<usize>(), any::<usize>(), any::<bool>()).prop_map(|(a, d, k)| Step::Sum(a, d, k)),
        any::<usize>().prop_map(Step::Permute),
        any::<usize>().prop_map(Step::Reshape),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::F64, DType::BF16, DType::F16])
}

/// Builds a valid trace: each step picks operands among values whose types fit.
fn build(shapes: &[Vec<usize>], dt: DType, steps: &[Step]) -> Trace {
    // the text form does not spell the kind; a plain function parses back as a computation
    let mut b = TraceBuilder::new("fuzzed", TraceKind::Computation);
    let mut vals: Vec<(ValueId, Vec<usize>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (
                b.arg(&format!("a{i}"), Type::tensor(s.clone(), dt, Device::CPU)),
                s.clone(),
            )
        })
        .collect();
    for st in steps {
        let pick = |i: &usize, vals: &Vec<(ValueId, Vec<usize>)>| vals[i % vals.len()].clone();
        let made = match st {
            Step::Unary(op, a) => {
                let (v, s) = pick(a, &vals);
                b.op(op, vec![v.into()]).ok().map(|o| (o, s))
            }
            Step::Binary(op, a, c) => {
                let (v, s) = pick(a, &vals);
                let same: Vec<_> = vals.iter().filter(|(_, t)| *t == s).cloned().collect();
                let (w, _) = same[c % same.len()].clone();
                b.op(op, vec![v.into(), w.into()]).ok().map(|o| (o, s))
            }
            Step::Scalar(op, a, x) => {
                let (v, s) = pick(a, &vals);
                b.op(op, vec![v.into(), Arg::Float(*x)])
                    .ok()
                    .map(|o| (o, s))
            }
            Step::Sum(a, d, keep) => {
                let (v, s) = pick(a, &vals);
                if s.is_empty() {
                    None
                } else {
                    let d = d % s.len();
                    let mut out = s.clone();
                    if *keep {
                        out[d] = 1;
                    } else {
                        out.remove(d);
                    }
                    b.op(
                        "ltorch.sum",
                        vec![v.into(), Arg::int_tuple([d as i64]), Arg::Bool(*keep)],
                    )
                    .ok()
                    .map(|o| (o, out))
                }
            }
            Step::Permute(a) => {
                let (v, s) = pick(a, &vals);
                let perm: Vec<i64> = (0..s.len() as i64).rev().collect();
                let out: Vec<usize> = s.iter().rev().copied().collect();
                b.op("ltorch.permute", vec![v.into(), Arg::int_tuple(perm)])
                    .ok()
                    .map(|o| (o, out))
            }
            Step::Reshape(a) => {
                let (v, s) = pick(a, &vals);
                let n: usize = s.iter().product();
                b.op("ltorch.reshape", vec![v.into(), Arg::int_tuple([n as i64])])
                    .ok()
                    .map(|o| (o, vec![n]))
            }
        };
        if let Some(m) = made {
            vals.push(m);
        }
    }
    let last = vals.last().map(|(v, _)| *v).unwrap_or(ValueId(0));
    b.ret(Arg::Tuple(vec![Arg::Value(last)]));
    b.finish()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_valid_traces_round_trip_through_text_and_binary(
        shapes in prop::collection::vec(prop::collection::vec(1usize..5, 0..4), 1..4),
        dt in dtype(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let t = build(&shapes, dt, &steps);
        prop_assert!(verify(&t).is_ok(), "{:?}", verify(&t));
        let text = print_trace(&t);
        let back = parse_trace(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &t);
        prop_assert_eq!(print_trace(&back), text);
        let bytes = codec::encode(&Module::Trace(t.clone())).unwrap();
        prop_assert_eq!(codec::decode(&bytes).unwrap(), Module::Trace(t));
    }
}
