//! Compiling kernel sources with NVRTC: a CUBIN for a real GPU (`sm_XY`, nothing left to the
//! driver's JIT, so a driver older than this NVRTC still loads it) or PTX for a virtual
//! architecture (`compute_XY`). Unlike cudarc's `compile_ptx`, nothing here panics: a missing
//! library or a failed compile is an error with NVRTC's log.

use super::kernels::Source;
use cudarc::nvrtc::{result, sys};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::{Mutex, OnceLock};

/// What NVRTC produced.
#[derive(Clone, Debug)]
pub enum Image {
    /// PTX text (NUL-terminated, as the driver takes it).
    Ptx(Vec<u8>),
    /// A CUBIN for one real architecture.
    Cubin(Vec<u8>),
}

impl Image {
    /// The PTX text, if this is PTX (without the trailing NUL).
    pub fn ptx_text(&self) -> Option<&str> {
        match self {
            Image::Ptx(b) => std::str::from_utf8(b.strip_suffix(&[0]).unwrap_or(b)).ok(),
            Image::Cubin(_) => None,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Image::Ptx(b) | Image::Cubin(b) => b,
        }
    }

    /// For `CudaContext::load_module`.
    pub fn into_module_image(self) -> cudarc::nvrtc::Ptx {
        match self {
            // the driver reads PTX up to its NUL, a CUBIN by its ELF header
            Image::Ptx(b) | Image::Cubin(b) => cudarc::nvrtc::Ptx::from_binary(b),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NvrtcError {
    #[error("NVRTC is not available: {0}")]
    Unavailable(String),
    #[error("NVRTC failed on kernel `{kernel}` for {arch}: {message}")]
    Failed {
        kernel: String,
        arch: String,
        message: String,
    },
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn available() -> Result<(), NvrtcError> {
    // SAFETY: only tries to dlopen the library.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(NvrtcError::Unavailable(
            "libnvrtc.so could not be loaded (install the CUDA toolkit, or \
             `pip install nvidia-cuda-nvrtc-cu12` and put its lib/ on LD_LIBRARY_PATH)"
                .into(),
        ))
    }
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    available()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    r.result()
        .map_err(|e| NvrtcError::Unavailable(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// The real architectures (`sm_XY` numbers, e.g. 90) this NVRTC can build for.
pub fn supported_archs() -> Result<Vec<i32>, NvrtcError> {
    available()?;
    let mut n = 0;
    // SAFETY: out-parameter, then a buffer of the size NVRTC gave.
    let r = unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) };
    r.result()
        .map_err(|e| NvrtcError::Unavailable(format!("nvrtcGetNumSupportedArchs: {e:?}")))?;
    let mut archs = vec![0i32; usize::try_from(n).unwrap_or(0)];
    // SAFETY: `archs` holds `n` ints.
    let r = unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
    r.result()
        .map_err(|e| NvrtcError::Unavailable(format!("nvrtcGetSupportedArchs: {e:?}")))?;
    Ok(archs)
}

/// Destroys the program on every path out of `compile`.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by create_program, destroyed once.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn c_text(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles `src` for `arch`: `sm_XY` gives a CUBIN, `compute_XY` (or `None`, NVRTC's default)
/// gives PTX.
pub fn compile(src: &Source, arch: Option<&str>) -> Result<Image, NvrtcError> {
    available()?;
    let arch_name = arch.unwrap_or("NVRTC's default architecture").to_string();
    let fail = |message: String| NvrtcError::Failed {
        kernel: src.name.clone(),
        arch: arch_name.clone(),
        message,
    };
    let code = CString::new(src.code.as_bytes())
        .map_err(|_| fail("the source contains a NUL byte".into()))?;
    let name = CString::new(format!("{}.cu", src.name))
        .map_err(|_| fail("the name contains a NUL byte".into()))?;
    let prog = Program(
        result::create_program(code.as_c_str(), Some(name.as_c_str()))
            .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?,
    );
    let mut options = vec!["--std=c++17".to_string()];
    if let Some(a) = arch {
        options.push(format!("--gpu-architecture={a}"));
    }
    // SAFETY: `prog` is live; the options are plain strings.
    if let Err(e) = unsafe { result::compile_program(prog.0, &options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| c_text(&l))
            .unwrap_or_default();
        return Err(fail(format!("{e:?}: {}", log.trim())));
    }
    let cubin = arch.is_some_and(|a| a.starts_with("sm_"));
    if cubin {
        let mut size = 0usize;
        // SAFETY: out-parameter on a compiled program.
        unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
            .result()
            .map_err(|e| fail(format!("nvrtcGetCUBINSize: {e:?}")))?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the size NVRTC reported.
        unsafe { sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr().cast()) }
            .result()
            .map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}")))?;
        if buf.is_empty() {
            return Err(fail("NVRTC returned an empty CUBIN".into()));
        }
        Ok(Image::Cubin(buf))
    } else {
        // SAFETY: a compiled program.
        let ptx = unsafe { result::get_ptx(prog.0) }.map_err(|e| fail(format!("{e:?}")))?;
        let mut bytes: Vec<u8> = ptx.iter().map(|&c| c as u8).collect();
        if bytes.last() != Some(&0) {
            bytes.push(0);
        }
        Ok(Image::Ptx(bytes))
    }
}

/// What [`compile_for_device_cached`] built, by kernel name and compute capability, with the
/// source it came from (a name with other code is compiled anew).
type Built = HashMap<(String, (i32, i32)), (String, Image, String)>;

/// [`compile_for_device`], once per process for each kernel and compute capability. Every
/// backend (one per rank or GPU, and a new one per run) loads its modules from these images
/// instead of calling NVRTC again: a compile takes tens of milliseconds, a load microseconds.
pub fn compile_for_device_cached(
    src: &Source,
    cc: (i32, i32),
) -> Result<(Image, String), NvrtcError> {
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    let key = (src.name.clone(), cc);
    if let Some((code, image, arch)) = built.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        if *code == src.code {
            return Ok((image.clone(), arch.clone()));
        }
    }
    // compiled outside the lock: ranks compiling different kernels do not wait on each other
    let (image, arch) = compile_for_device(src, cc)?;
    built
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (src.code.clone(), image.clone(), arch.clone()));
    Ok((image, arch))
}

/// The driver's view of a kernel module: a CUBIN for the device's own `sm_XY` when this NVRTC
/// knows it; otherwise PTX for NVRTC's newest architecture not above the device (the driver
/// compiles it). The second value says which was built, for messages.
pub fn compile_for_device(src: &Source, cc: (i32, i32)) -> Result<(Image, String), NvrtcError> {
    let sm = cc.0 * 10 + cc.1;
    let known = supported_archs().unwrap_or_default();
    if known.contains(&sm) {
        let arch = format!("sm_{sm}");
        if let Ok(img) = compile(src, Some(&arch)) {
            return Ok((img, arch));
        }
    }
    // fall back to PTX: the newest virtual architecture this NVRTC has that the device runs
    match known.iter().copied().filter(|&a| a <= sm).max() {
        Some(a) => {
            let arch = format!("compute_{a}");
            Ok((compile(src, Some(&arch))?, arch))
        }
        None => Ok((compile(src, None)?, "default PTX".into())),
    }
}
