//! Parses and verifies every trace file named on the command line (a development aid).
fn main() {
    let mut failed = 0;
    for path in std::env::args().skip(1) {
        if tracepass_ir::is_export_dir(std::path::Path::new(&path)) {
            match tracepass_ir::load_export(std::path::Path::new(&path)) {
                Ok(e) => {
                    let p = &e.program;
                    println!(
                        "{path}: export ok: {} params ({} trainable, {} buffers, {} tied), inputs {:?}",
                        p.params.len(),
                        p.params.iter().filter(|x| x.requires_grad).count(),
                        p.params.iter().filter(|x| x.buffer).count(),
                        p.params.iter().filter(|x| x.tied_to.is_some()).count(),
                        p.data_inputs()
                    );
                }
                Err(e) => {
                    failed += 1;
                    println!("{path}: EXPORT {e}");
                }
            }
            continue;
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                println!("{path}: {e}");
                failed += 1;
                continue;
            }
        };
        match tracepass_ir::parse_trace(&text) {
            Err(e) => {
                failed += 1;
                println!("{path}: PARSE {e}");
            }
            Ok(t) => match tracepass_ir::verify(&t) {
                Ok(()) => println!("{path}: ok ({} nodes)", t.node_count()),
                Err(e) => {
                    failed += 1;
                    println!("{path}: VERIFY {e}");
                }
            },
        }
    }
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
