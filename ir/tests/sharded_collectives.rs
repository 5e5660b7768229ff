//! `dist.all_gather_async` and `dist.reduce_scatter_async` (the `fsdp` pass's collectives):
//! their metas, the verifier's rules for futures and in-place buffers, and the text and binary
//! forms.

use tracepass_ir::{codec, parse_trace, print_trace, verify, Module};

const HEADER: &str = "def f(shard, g):\n  # shard: \"cpu f32[3]\"\n  # g: \"cpu f32[12]\"\n";

fn trace(body: &str, ret: &str) -> String {
    format!("{HEADER}{body}  return {ret}\n")
}

const GOOD: &str = concat!(
    "  ft0 = dist.all_gather_async(shard, 'world', world_size=4)  # ft0: \"FUTURE cpu f32[12]\"\n",
    "  ft1 = dist.reduce_scatter_async(g, 'sum', 'world', world_size=4)  # ft1: \"FUTURE cpu f32[3]\"\n",
    "  t0 = dist.wait(ft0)  # t0: \"cpu f32[12]\"\n",
    "  t1 = dist.wait(ft1)  # t1: \"cpu f32[3]\"\n",
);

#[test]
fn gather_and_scatter_sizes_follow_the_world_size() {
    let t = parse_trace(&trace(GOOD, "(t0, t1)")).unwrap();
    verify(&t).unwrap();
    let shape = |name: &str| {
        t.ty(t.find_value(name).unwrap())
            .unwrap()
            .as_tensor()
            .unwrap()
            .shape
            .to_vec()
    };
    assert_eq!(shape("t0"), [12]);
    assert_eq!(shape("t1"), [3]);
}

#[test]
fn text_and_binary_forms_round_trip() {
    let t = parse_trace(&trace(GOOD, "(t0, t1)")).unwrap();
    let printed = print_trace(&t);
    assert!(printed.contains("ft0 = dist.all_gather_async(shard, 'world', world_size=4)"));
    assert!(printed.contains("ft1 = dist.reduce_scatter_async(g, 'sum', 'world', world_size=4)"));
    let again = parse_trace(&printed).unwrap();
    assert_eq!(print_trace(&again), printed);
    let m = Module::Trace(t);
    assert!(codec::decode(&codec::encode(&m).unwrap()).unwrap() == m);
}

#[test]
fn a_buffer_that_does_not_split_evenly_is_an_error() {
    let body = "  ft1 = dist.reduce_scatter_async(g, 'sum', 'world', world_size=5)  # ft1: \"FUTURE cpu f32[2]\"\n  t1 = dist.wait(ft1)  # t1: \"cpu f32[2]\"\n";
    let err = parse_trace(&trace(body, "t1"))
        .map(|t| verify(&t).unwrap_err().to_string())
        .unwrap_or_else(|e| e.to_string());
    assert!(
        err.contains("12 elements do not split into 5 equal shards"),
        "{err}"
    );
}

#[test]
fn a_declared_type_that_disagrees_with_the_meta_is_an_error() {
    let body = "  ft0 = dist.all_gather_async(shard, 'world', world_size=2)  # ft0: \"FUTURE cpu f32[12]\"\n  t0 = dist.wait(ft0)  # t0: \"cpu f32[12]\"\n";
    let err = parse_trace(&trace(body, "t0"))
        .map(|t| verify(&t).unwrap_err().to_string())
        .unwrap_or_else(|e| e.to_string());
    assert!(err.contains("f32[6]"), "{err}");
}

#[test]
fn their_futures_are_waited_exactly_once() {
    // never waited
    let body = "  ft0 = dist.all_gather_async(shard, 'world', world_size=4)  # ft0: \"FUTURE cpu f32[12]\"\n";
    let err = verify(&parse_trace(&trace(body, "shard")).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("ft0"), "{err}");
    // waited twice
    let body = "  ft1 = dist.reduce_scatter_async(g, 'sum', 'world', world_size=4)  # ft1: \"FUTURE cpu f32[3]\"\n  t1 = dist.wait(ft1)  # t1: \"cpu f32[3]\"\n  t2 = dist.wait(ft1)  # t2: \"cpu f32[3]\"\n";
    let err = verify(&parse_trace(&trace(body, "(t1, t2)")).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("ft1"), "{err}");
}

#[test]
fn a_reduce_scattered_buffer_is_not_read_again_but_a_gathered_shard_is() {
    let body = "  ft1 = dist.reduce_scatter_async(g, 'sum', 'world', world_size=4)  # ft1: \"FUTURE cpu f32[3]\"\n  t1 = dist.wait(ft1)  # t1: \"cpu f32[3]\"\n  t2 = prims.neg(g)  # t2: \"cpu f32[12]\"\n";
    let err = verify(&parse_trace(&trace(body, "(t1, t2)")).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("uses `g` after it was handed to dist.reduce_scatter_async"),
        "{err}"
    );
    let body = "  ft0 = dist.all_gather_async(shard, 'world', world_size=4)  # ft0: \"FUTURE cpu f32[12]\"\n  t0 = dist.wait(ft0)  # t0: \"cpu f32[12]\"\n  t2 = prims.neg(shard)  # t2: \"cpu f32[3]\"\n";
    verify(&parse_trace(&trace(body, "(t0, t2)")).unwrap()).unwrap();
}

#[test]
fn only_flat_buffers_are_sharded() {
    let text = "def f(x):\n  # x: \"cpu f32[2, 2]\"\n  ft0 = dist.all_gather_async(x, 'world', world_size=2)  # ft0: \"FUTURE cpu f32[8]\"\n  t0 = dist.wait(ft0)  # t0: \"cpu f32[8]\"\n  return t0\n";
    let err = parse_trace(text)
        .map(|t| verify(&t).unwrap_err().to_string())
        .unwrap_or_else(|e| e.to_string());
    assert!(err.contains("takes a flat (1-d) buffer"), "{err}");
}
