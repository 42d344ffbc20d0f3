//! The cuda backend behind [`crate::Model`]: the model's graph specialised to each input
//! shape signature it meets (as the cpu backend does for symbolic dims), run through the
//! cuda pipeline and lowering, loaded on the GPU once per signature (weights uploaded,
//! arena allocated), and run there with copies only at the graph's edges.

use crate::specialize::Signature;
use crate::Error;
use aim_cuda::device::{Device, Loaded};
use aim_cuda::GpuTarget;
use aim_ir::{Graph, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A model on a GPU.
pub(crate) struct CudaExec {
    device: Device,
    target: GpuTarget,
    /// The type-inferred graph, weights kept, specialised per signature.
    graph: Graph,
    path: String,
    /// Loaded programs by input-shape signature, the most recently used last; at most
    /// `capacity` (each holds device memory: its weights and arena).
    programs: Mutex<Vec<(Signature, Arc<Loaded>)>>,
    capacity: usize,
}

fn compile_error(path: &str, msg: impl ToString) -> Error {
    Error::Compile { path: path.to_string(), msg: msg.to_string() }
}

impl CudaExec {
    /// Opens GPU 0 and, for a model whose inputs are all static, compiles and loads it.
    pub(crate) fn new(
        graph: Graph,
        path: &str,
        allow_tf32: bool,
        half_weights: bool,
        capacity: usize,
    ) -> Result<CudaExec, Error> {
        let device = Device::open(0).map_err(|e| compile_error(path, e))?;
        // PTX for sm_90 runs on later GPUs too (the driver compiles it for them).
        let base = if device.sm >= 90 { GpuTarget::SM90 } else { GpuTarget { sm: device.sm, ..GpuTarget::SM80 } };
        let exec = CudaExec {
            device,
            target: base.with_tf32(allow_tf32).with_half(half_weights.then_some(aim_cuda::Half::F16)),
            graph,
            path: path.to_string(),
            programs: Mutex::new(Vec::new()),
            capacity: capacity.max(1),
        };
        let sig: Option<Signature> = exec.graph.inputs.iter().map(|i| i.ty.concrete_shape()).collect();
        if let Some(sig) = sig {
            exec.program(&sig)?;
        }
        Ok(exec)
    }

    /// The GPU's name and architecture.
    pub(crate) fn describe(&self) -> String {
        format!("{} (sm_{})", self.device.name, self.device.sm)
    }

    fn program(&self, sig: &Signature) -> Result<Arc<Loaded>, Error> {
        {
            let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = programs.iter().position(|(s, _)| s == sig) {
                let hit = programs.remove(i);
                let p = hit.1.clone();
                programs.push(hit);
                return Ok(p);
            }
        }
        let p = crate::gpu::compile(&self.graph, sig, &self.target, &self.path)?;
        let loaded = Arc::new(self.device.load(p).map_err(|e| compile_error(&self.path, e))?);
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        if programs.len() >= self.capacity {
            // The least recently used goes (its device memory with it, once no run holds it).
            programs.remove(0);
        }
        programs.push((sig.clone(), loaded.clone()));
        Ok(loaded)
    }

    /// Runs the model on the inputs by name (outputs in graph order).
    pub(crate) fn run(&self, inputs: &HashMap<String, Tensor>) -> Result<Vec<Tensor>, Error> {
        let mut sig = Vec::with_capacity(self.graph.inputs.len());
        for i in &self.graph.inputs {
            let t = inputs.get(&i.name).ok_or_else(|| aim_runtime::RunError::MissingInput {
                name: i.name.clone(),
                expected: i.ty.to_string(),
            })?;
            if i.ty.dtype.is_some_and(|d| d != t.dtype()) {
                return Err(compile_error(
                    &self.path,
                    format!("input '{}' is {}, the model takes {}", i.name, t.dtype(), i.ty),
                ));
            }
            sig.push(t.shape().to_vec());
        }
        let p = self.program(&sig)?;
        p.run(inputs).map_err(|e| Error::Compile { path: self.path.clone(), msg: format!("running on the GPU: {e}") })
    }
}
