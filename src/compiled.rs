//! `.aim` files on the facade's side: compiling a model into one (`aim compile`), and
//! loading one as a [`Model`] (every command and API that takes a model path takes a `.aim`
//! file too). The format itself is `aim_ir::aim_file` (`ir-spec/FORMAT.md`).
//!
//! A model whose input dims are all static (or made so with one `--shape` signature) is
//! stored *optimized*: the cpu pipeline's output for the target, with the target recorded,
//! so loading skips import and every graph pass and maps the weights in place. A model
//! with symbolic dims is stored as its *source* graph (imported and type-inferred): each
//! input shape is specialised at load or first use, as for ONNX.

use crate::{specialize, Backend, Error, Exec, Generic, Model, Options};
use aim_compiler::target::Target;
use aim_ir::aim_file::{self, Header};
use std::path::Path;

/// What [`compile_to_file`] wrote.
#[derive(Clone, Debug)]
pub struct CompileSummary {
    /// `optimized` or `source` (see the module docs).
    pub stage: String,
    /// The ISA level it was compiled for.
    pub level: String,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// Nodes of the stored graph.
    pub nodes: usize,
}

/// Whether the file at `path` is a `.aim` file (by its magic, not its name).
pub fn is_aim_file(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && aim_file::is_aim_file(&head)
}

/// The model at `path` as the IR: an ONNX file imported, or the graph a `.aim` file holds
/// (an optimized one holds `aim`-domain ops that only the cpu backend runs; of a package
/// for several targets, the program this CPU would load, else the first).
pub fn import(path: &Path) -> Result<aim_ir::Model, Error> {
    if is_aim_file(path) {
        let choose = |hs: &[Header]| Ok(crate::package::choose(hs, "native").unwrap_or(0));
        Ok(aim_file::read_choosing(path, &choose)?.model)
    } else {
        Ok(aim_onnx::import_file(path)?)
    }
}

/// The header of the `.aim` file at `path` (of its first program), with the bytes of its
/// data section and the number of constants whose checksums were verified when `verify`
/// is set.
pub fn header(path: &Path, verify: bool) -> Result<(Header, usize, Option<usize>), Error> {
    let f = aim_file::read(path)?;
    let verified = if verify {
        Some(f.verify().map_err(|reason| aim_file::AimFileError { path: path.display().to_string(), reason })?)
    } else {
        None
    };
    Ok((f.header.clone(), f.data_bytes(), verified))
}

/// Compiles the ONNX model at `model` for this CPU (capped by `opts.cpu`) into the `.aim`
/// file `out`. `opts.shapes` may give one signature: the program is then specialised to
/// it and stored optimized.
pub fn compile_to_file(model: &Path, out: &Path, opts: &Options) -> Result<CompileSummary, Error> {
    let p = model.display().to_string();
    crate::guard::contain(&format!("compiling {p}"), || {
        something_to_write(opts.opt_level)?;
        let mut ir = import_checked(model)?;
        let target = crate::cpu_target(opts)?;
        let sigs = crate::signatures(&ir.graph, &opts.shapes, &p)?;
        let stage = match sigs.as_slice() {
            [] if specialize::worthwhile(&ir.graph) => "source",
            [] => "optimized",
            [sig] => {
                specialize::bind(&mut ir.graph, sig, &p)?;
                "optimized"
            }
            _ => {
                return Err(Error::BadOption {
                    option: "shape",
                    reason: "a .aim file holds one specialised program: give each input one --shape".into(),
                })
            }
        };
        if stage == "optimized" {
            ir.graph = prepack(crate::optimize(ir.graph, &target, &p)?, &target, &p)?;
        }
        let nodes = ir.graph.nodes.len();
        let header = header_for(stage, &target, model, None);
        aim_file::write(out, &ir, &header)?;
        let file_bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
        Ok(CompileSummary { stage: stage.to_string(), level: target.level.name().to_string(), file_bytes, nodes })
    })
}

/// Refuses `-O0` for ahead-of-time compilation: that level runs the reference kernels, so
/// there is no compiled program to write.
pub(crate) fn something_to_write(level: crate::OptLevel) -> Result<(), Error> {
    if level == crate::OptLevel::O0 {
        return Err(Error::BadOption {
            option: "opt-level",
            reason: "-O0 runs the reference kernels: there is no compiled program to write".into(),
        });
    }
    Ok(())
}

/// Imports the ONNX model at `model`, verifies it, checks that aim can run its ops and
/// infers its types: what compiling it ahead of time starts from.
pub(crate) fn import_checked(model: &Path) -> Result<aim_ir::Model, Error> {
    let p = model.display().to_string();
    let mut ir = aim_onnx::import_file(model)?;
    aim_ir::verify(&ir.graph).map_err(|cause| Error::Verify { path: p.clone(), cause })?;
    let ops = aim_runtime::unsupported_ops(&ir.graph);
    if !ops.is_empty() {
        return Err(Error::Unsupported { path: p, ops });
    }
    aim_ir::infer::infer_types(&mut ir.graph).map_err(|cause| Error::Infer { path: p, cause })?;
    Ok(ir)
}

/// The header of a program of `stage` compiled from `model` for `target`.
pub(crate) fn header_for(stage: &str, target: &Target, model: &Path, plan: Option<aim_file::ArenaPlan>) -> Header {
    Header {
        stage: stage.to_string(),
        target: [
            ("arch", target.arch.to_string()),
            ("level", target.level.name().to_string()),
            ("l1d", target.l1d.to_string()),
            ("l2", target.l2.to_string()),
            ("l3", target.l3.to_string()),
            ("opt_level", target.optimization.level.number().to_string()),
            ("disabled_passes", target.optimization.disabled.join(",")),
            ("weights", crate::WeightChoice::of(target).name()),
        ]
        .into_iter()
        .filter(|(k, v)| !((*k == "disabled_passes" && v.is_empty()) || (*k == "weights" && v == "f32")))
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        writer: format!("aim {}", env!("CARGO_PKG_VERSION")),
        source: model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        plan,
    }
}

/// The optimized graph with the weights of its convolutions and dense layers replaced by
/// the packed floats their kernels read on `target` (see `runtime/src/cpu/prepacked.rs`):
/// what loading then reads in place instead of packing. The unpacked weights nothing else
/// reads are dropped.
pub(crate) fn prepack(mut g: aim_ir::Graph, target: &Target, path: &str) -> Result<aim_ir::Graph, Error> {
    let threads = target.physical_cores.max(1);
    let pool = aim_runtime::pool::ThreadPool::new(threads)
        .map(std::sync::Arc::new)
        .map_err(|e| aim_runtime::RunError::Threads { threads, reason: e.to_string() })?;
    let prog = crate::build_program(g.clone(), target, &pool, path)?;
    for (i, kind, packed) in prog.prepacked() {
        let n = &mut g.nodes[i];
        let Some(mut dims) = n.inputs.get(1).and_then(|w| g.initializers.get(w)).map(|w| w.shape().to_vec()) else {
            continue;
        };
        // A dense weight stored transposed is packed in its logical `[K, N]` order.
        if matches!(n.attrs.remove(aim_compiler::passes::fuse::TRANS_B), Some(aim_ir::Attr::Int(t)) if t != 0) {
            dims.reverse();
        }
        let name = format!("{}/packed_{kind}", n.name);
        n.inputs[1] = name.clone();
        n.attrs.insert("prepacked".into(), aim_ir::Attr::String(kind.into()));
        // The dense layout depends on the depth blocking: recorded with it, as the cache
        // sizes in the header may only change speed, never which floats are read where.
        if let Some(kc) = prog.packed_kc(i) {
            n.attrs.insert("packed_kc".into(), aim_ir::Attr::Int(kc as i64));
        }
        n.attrs.insert("weight_shape".into(), aim_ir::Attr::Ints(dims.iter().map(|&d| d as i64).collect()));
        g.initializers.insert(name, packed);
    }
    let mut read = Vec::new();
    g.names_read(&mut read);
    let read: std::collections::HashSet<String> = read.into_iter().collect();
    g.initializers.retain(|k, _| read.contains(k));
    Ok(g)
}

/// The target an optimized `.aim` file was compiled for, on this host: the same ISA level
/// (the blocked layouts and kernels in the program are chosen for it) and the recorded
/// cache sizes (so the program blocks its loops exactly as where it was compiled).
pub(crate) fn recorded_target(h: &Header, path: &str, cpu: &str) -> Result<Target, Error> {
    let get = |k: &str| {
        h.target
            .get(k)
            .cloned()
            .ok_or_else(|| Error::Compile { path: path.to_string(), msg: format!("the file records no target '{k}'") })
    };
    let (arch, level) = (get("arch")?, get("level")?);
    let size = |k: &str| -> Result<usize, Error> {
        get(k)?.parse().map_err(|_| Error::Compile { path: path.to_string(), msg: format!("bad target '{k}'") })
    };
    let host = Target::host();
    if arch != host.arch {
        return Err(Error::Compile {
            path: path.to_string(),
            msg: format!("compiled for {arch}; this machine is {}", host.arch),
        });
    }
    if !matches!(cpu, "native" | "") && cpu != level {
        return Err(Error::BadOption {
            option: "cpu",
            reason: format!("{path} is compiled for {level}; --cpu {cpu} needs a compile for that level"),
        });
    }
    let host_level = host.level.name();
    let capped = match arch.as_str() {
        "aarch64" => host,
        _ => host.with_cpu(&level).map_err(|e| Error::Compile {
            path: path.to_string(),
            msg: format!("the file records target 'level' {level}, which aim does not know ({e})"),
        })?,
    };
    if capped.level.name() != level {
        return Err(Error::Compile {
            path: path.to_string(),
            msg: format!(
                "compiled for {level}, which this CPU does not support (it supports {host_level}): compile the ONNX model again here, or with --cpu {host_level}"
            ),
        });
    }
    Ok(capped.with_caches(size("l1d")?, size("l2")?, size("l3")?))
}

/// Loads a `.aim` file (see the module docs for the two stages).
pub(crate) fn load(path: &Path, opts: &Options) -> Result<Model, Error> {
    let p = path.display().to_string();
    let file = aim_file::read_choosing(path, &|hs: &[Header]| crate::package::choose(hs, &opts.cpu))?;
    let (header, mut ir) = (file.header.clone(), file.model);
    match header.stage.as_str() {
        "source" => {
            // The weights it was compiled with (`aim compile --weights`) for the cpu
            // pipeline, unless the caller chooses others.
            let mut opts = opts.clone();
            let compiles = opts.backend == Backend::Cpu && opts.opt_level != crate::OptLevel::O0;
            if let Some(w) = header.target.get("weights").filter(|_| compiles) {
                if crate::WeightChoice::of_options(&opts) == crate::WeightChoice::default() {
                    crate::parse_weights(w)
                        .map_err(|e| Error::Compile { path: p.clone(), msg: format!("recorded weights '{w}': {e}") })?
                        .apply(&mut opts);
                }
            }
            Model::from_ir_with(ir, path, &opts)
        }
        "optimized" => {
            if opts.backend != Backend::Cpu {
                return Err(Error::BadOption {
                    option: "backend",
                    reason: format!(
                        "{p} holds a program compiled for the cpu backend; the reference backend needs the ONNX model"
                    ),
                });
            }
            if !opts.shapes.is_empty() {
                return Err(Error::BadOption {
                    option: "shape",
                    reason: format!("{p} holds a program compiled for static shapes"),
                });
            }
            if opts.opt_level != crate::OptLevel::O3 || !opts.disabled_passes.is_empty() {
                return Err(Error::BadOption {
                    option: if opts.disabled_passes.is_empty() { "opt-level" } else { "disable-pass" },
                    reason: format!(
                        "{p} holds a program optimised when it was compiled: give -O and --disable-pass to aim compile"
                    ),
                });
            }
            if let Some(t) = opts.threads.filter(|&t| t > crate::MAX_THREADS) {
                return Err(Error::BadOption {
                    option: "threads",
                    reason: format!("{t} is more than {}", crate::MAX_THREADS),
                });
            }
            if let Some(b) = opts.max_tensor_bytes {
                aim_ir::limits::set_max_tensor_bytes(b);
            }
            aim_ir::verify(&ir.graph).map_err(|cause| Error::Verify { path: p.clone(), cause })?;
            let mut target = recorded_target(&header, &p, &opts.cpu)?;
            target.memory_budget = opts.memory_budget;
            let threads = opts.threads.unwrap_or(target.physical_cores).max(1);
            let pool = crate::thread_pool(threads, opts)?;
            let prog = crate::build_program(ir.graph.clone(), &target, &pool, &p)?;
            let generic = Generic { cell: std::sync::OnceLock::new(), threads };
            let _ = generic.cell.set(Ok(Box::new(prog)));
            ir.graph.initializers.clear();
            Ok(Model {
                ir,
                path: path.to_path_buf(),
                backend: Backend::Cpu,
                exec: Exec::Cpu(generic, None),
                run_opts: aim_runtime::RunOptions { timeout: opts.timeout },
                // Files from before levels were recorded were compiled at -O3.
                opt_level: header
                    .target
                    .get("opt_level")
                    .and_then(|l| l.parse().ok())
                    .and_then(crate::OptLevel::from_number)
                    .unwrap_or(crate::OptLevel::O3),
            })
        }
        other => Err(Error::Compile {
            path: p,
            msg: format!("unknown stage '{other}' (this aim reads optimized and source)"),
        }),
    }
}
