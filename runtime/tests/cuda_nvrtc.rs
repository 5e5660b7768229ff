//! Every kernel the CUDA backend can launch, compiled by NVRTC on the CPU (no GPU needed):
//! PTX for compute_80 and compute_90, each assembled by `ptxas` for sm_80 / sm_90 when the
//! environment variable PTXAS names one, or else built by NVRTC itself as a CUBIN for sm_80 /
//! sm_90 (what the backend loads on a device; `the_device_build_prefers_a_cubin_for_the_device`
//! checks that path with PTXAS set too). The kernels come from `cuda::kernels::catalog()`, the
//! one list of them: every `Kernel` variant (the list is an exhaustive match, so a new variant
//! does not build until it is listed) x every dtype of `ALL_DTYPES` it has a kernel for, so a
//! new op cannot be left out.
//!
//! Without libnvrtc the test prints why and passes; with `TRACEPASS_REQUIRE_NVRTC=1` (CI)
//! that is a failure. NVRTC comes with the CUDA toolkit or from PyPI:
//! `pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12`, with the wheel's `lib/` on
//! LD_LIBRARY_PATH and PTXAS set to the `ptxas` in `nvidia/cuda_nvcc/bin`.
#![cfg(feature = "cuda")]

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use tracepass_runtime::cuda::nvrtc::{self, Image};
use tracepass_runtime::cuda::{catalog, every_kernel, sources, Source, ALL_DTYPES};

const ARCHS: [(&str, &str); 2] = [("compute_80", "sm_80"), ("compute_90", "sm_90")];

/// Whether NVRTC can run here; `None` (after printing why) when the test should skip.
fn nvrtc_or_skip() -> Option<()> {
    match nvrtc::available().and_then(|()| nvrtc::version()) {
        Ok((major, minor)) => {
            let _ = writeln!(std::io::stderr(), "NVRTC {major}.{minor}");
            Some(())
        }
        Err(e) => {
            let required = std::env::var("TRACEPASS_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
            assert!(!required, "TRACEPASS_REQUIRE_NVRTC=1 but {e}");
            // straight to stderr: the harness does not capture it, so the reason shows
            let _ = writeln!(std::io::stderr(), "skipping the NVRTC test: {e}");
            None
        }
    }
}

/// Assembles `ptx` for `sm` with the `ptxas` at `$PTXAS`; the error is ptxas's output.
fn ptxas(
    ptxas: &str,
    src: &Source,
    ptx: &str,
    sm: &str,
    dir: &std::path::Path,
) -> Result<(), String> {
    let input = dir.join(format!("{}_{sm}.ptx", src.name));
    let output = dir.join(format!("{}_{sm}.cubin", src.name));
    std::fs::write(&input, ptx).map_err(|e| format!("writing {}: {e}", input.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={sm}"))
        .arg("-o")
        .arg(&output)
        .arg(&input)
        .output()
        .map_err(|e| format!("running {ptxas}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let cubin = std::fs::read(&output).map_err(|e| e.to_string())?;
    if !cubin.starts_with(b"\x7fELF") {
        return Err("ptxas wrote no ELF file".into());
    }
    Ok(())
}

/// Compiles one kernel every way; the failures, each naming the kernel and the target.
fn check_one(src: &Source, ptxas_path: Option<&str>, dir: &std::path::Path) -> Vec<String> {
    let mut failures = Vec::new();
    for (virt, real) in ARCHS {
        match nvrtc::compile(src, Some(virt)) {
            Ok(img) => {
                let Some(ptx) = img.ptx_text() else {
                    failures.push(format!("{} {virt}: NVRTC gave no PTX text", src.name));
                    continue;
                };
                if !ptx.contains(&format!(".entry {}(", src.name)) {
                    failures.push(format!(
                        "{} {virt}: the PTX has no entry `{}`",
                        src.name, src.name
                    ));
                }
                let target = format!(".target sm_{}", &virt["compute_".len()..]);
                if !ptx.contains(&target) {
                    failures.push(format!("{} {virt}: the PTX is not for {target}", src.name));
                }
                if let Some(p) = ptxas_path {
                    if let Err(e) = ptxas(p, src, ptx, real, dir) {
                        failures.push(format!("{} ptxas {real}: {e}", src.name));
                    }
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
        // without ptxas, NVRTC's own CUBIN for the real architecture (the backend's path on
        // a device) is the check that the PTX assembles
        if ptxas_path.is_none() {
            match nvrtc::compile(src, Some(real)) {
                Ok(Image::Cubin(b)) if b.starts_with(b"\x7fELF") => {}
                Ok(_) => failures.push(format!("{} {real}: NVRTC gave no CUBIN", src.name)),
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    failures
}

#[test]
fn every_kernel_compiles_for_compute_80_and_90() {
    let Some(()) = nvrtc_or_skip() else { return };
    let kernels = catalog();
    let ptxas_path = std::env::var("PTXAS").ok().filter(|p| !p.is_empty());
    if let Some(p) = &ptxas_path {
        assert!(PathBuf::from(p).is_file(), "PTXAS={p} is not a file");
    } else {
        let _ = writeln!(std::io::stderr(), "PTXAS is not set: PTX is not assembled");
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let start = std::time::Instant::now();
    // two threads: NVRTC and ptxas are single-threaded, and CI has two cores
    let (first, second) = kernels.split_at(kernels.len() / 2);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = [first, second]
            .into_iter()
            .map(|part| {
                let (p, d) = (ptxas_path.as_deref(), dir.path());
                s.spawn(move || {
                    part.iter()
                        .flat_map(|k| check_one(k, p, d))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a compile thread panicked"))
            .collect()
    });
    let _ = writeln!(
        std::io::stderr(),
        "{} kernels x {} architectures compiled{} in {:.1} s",
        kernels.len(),
        ARCHS.len(),
        if ptxas_path.is_some() {
            " and assembled"
        } else {
            ""
        },
        start.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} kernel builds failed:\n{}",
        failures.len(),
        kernels.len() * ARCHS.len(),
        failures.join("\n")
    );
}

#[test]
fn a_broken_kernel_is_an_error_with_the_log_not_a_panic() {
    let Some(()) = nvrtc_or_skip() else { return };
    let bad = Source {
        name: "broken".into(),
        code: "extern \"C\" __global__ void broken(float* o) { o[0] = INFINITY; }".into(),
    };
    let e = nvrtc::compile(&bad, Some("compute_80")).expect_err("INFINITY is undefined in NVRTC");
    let msg = e.to_string();
    assert!(
        msg.contains("broken") && msg.contains("compute_80"),
        "{msg}"
    );
    assert!(msg.contains("INFINITY"), "the log names the culprit: {msg}");
}

#[test]
fn the_device_build_prefers_a_cubin_for_the_device() {
    let Some(()) = nvrtc_or_skip() else { return };
    let archs = nvrtc::supported_archs().expect("NVRTC lists its architectures");
    assert!(archs.contains(&80) && archs.contains(&90), "{archs:?}");
    let k = &catalog()[0];
    let (img, arch) = nvrtc::compile_for_device(k, (9, 0)).expect("builds for sm_90");
    assert_eq!(arch, "sm_90");
    assert!(matches!(img, Image::Cubin(_)));
    // a device newer than this NVRTC knows gets PTX of the newest architecture it has
    let (img, arch) = nvrtc::compile_for_device(k, (99, 9)).expect("falls back to PTX");
    assert!(arch.starts_with("compute_"), "{arch}");
    assert!(img.ptx_text().is_some());
}

#[test]
fn the_catalog_holds_every_kernel_variant_in_every_dtype() {
    // no NVRTC needed: what the backend launches for each variant and dtype is compiled above
    let c = catalog();
    let mut launched = 0;
    for k in every_kernel() {
        for d in ALL_DTYPES {
            for s in sources(&k, d) {
                assert!(c.contains(&s), "{} ({k:?} in {d}) is not compiled", s.name);
                launched += 1;
            }
        }
    }
    assert!(
        launched >= c.len(),
        "{launched} launches, {} kernels",
        c.len()
    );
}

#[test]
fn built_images_are_kept_per_kernel_and_code() {
    let Some(()) = nvrtc_or_skip() else { return };
    let kernel = |value: &str| Source {
        name: "kept_image".into(),
        code: format!("extern \"C\" __global__ void kept_image(float* x) {{ x[0] = {value}; }}"),
    };
    let build = |src: &Source| {
        let (img, arch) = nvrtc::compile_for_device_cached(src, (9, 0)).expect("builds");
        assert_eq!(arch, "sm_90");
        img.bytes().to_vec()
    };
    let one = build(&kernel("1.0f"));
    assert!(one.starts_with(b"\x7fELF"));
    assert_eq!(
        build(&kernel("1.0f")),
        one,
        "the same source, the same image"
    );
    // another source under the same name is compiled anew, not served the kept image
    let two = build(&kernel("2.0f"));
    assert_ne!(two, one);
    assert_eq!(
        two,
        nvrtc::compile_for_device(&kernel("2.0f"), (9, 0))
            .expect("builds")
            .0
            .bytes()
    );
    assert_eq!(build(&kernel("1.0f")), one);
}
