//! Runs a whole [`CudaProgram`] (the cuda backend's compiled model) in the interpreter, as
//! the driver would run it on a GPU: inputs and constants uploaded, every launch in order,
//! the error flag checked, outputs read back. The tests use it to compare the cuda
//! backend with the reference kernels without a GPU.

use crate::{Arg, Launch, Memory, Module};
use aim_ir::Tensor;
use aim_runtime::cuda::{CudaProgram, Storage};
use std::collections::HashMap;

/// Where intermediate values live during [`run_program`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In one arena buffer at their planned offsets, as on the GPU: checks the memory plan
    /// (values alive together must not share bytes).
    Arena,
    /// Each in a buffer of its own: every access is checked against its own tensor.
    Separate,
}

/// Runs `p` on `inputs` (by name) and returns its outputs in order, or why it failed: an
/// input that does not match the program, a PTX parse error, an access outside a buffer,
/// a stuck kernel, or a raised error flag.
pub fn run_program(
    p: &CudaProgram,
    inputs: &HashMap<String, Tensor>,
    placement: Placement,
) -> Result<Vec<Tensor>, String> {
    let module = Module::parse(&p.module()).map_err(|e| e.to_string())?;
    let mut mem = Memory::new();
    let base = match placement {
        Placement::Arena => mem.alloc(p.arena_bytes),
        Placement::Separate => 0,
    };
    let addr = p.addresses::<String>(|v, val| {
        Ok(match &val.storage {
            Storage::Input => {
                mem.upload_bytes(p.input(v, inputs).map_err(|m| format!("input '{}': {m}", val.name))?.bytes())
            }
            Storage::Constant(t) => mem.upload_bytes(t.bytes()),
            Storage::Arena(off) if placement == Placement::Arena => base + *off as u64,
            Storage::Arena(_) => mem.alloc(val.bytes()),
            Storage::Alias(_) => 0,
        })
    })?;
    let flag = mem.alloc(4);
    for l in &p.launches {
        let k = &p.kernels[l.kernel];
        let args: Vec<Arg> = p.params(l, &addr, flag).into_iter().map(Arg::U64).collect();
        module
            .launch(&k.name, Launch { grid: k.grid, block: k.block }, &args, &mut mem)
            .map_err(|e| format!("{} (node {}): {e}", k.name, l.node))?;
    }
    if mem.read_bytes(flag, 4)? != [0; 4] {
        return Err("a kernel raised the error flag (an index out of range)".into());
    }
    p.outputs
        .iter()
        .map(|&o| {
            let v = &p.values[o];
            let bytes = mem.read_bytes(addr[o], v.bytes())?;
            Tensor::from_bytes(v.dtype, &v.shape, &bytes).map_err(|e| e.to_string())
        })
        .collect()
}
