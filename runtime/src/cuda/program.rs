//! The cuda backend's compiled program: what the compiler's lowering hands the runtime —
//! the PTX of every kernel with its launch geometry, the device values (inputs, constants
//! uploaded once, intermediates at offsets of one arena, views as aliases) and the
//! launches in order. Plain data: the runtime runs it through the driver
//! (`device.rs`, feature `cuda`), the tests through the PTX interpreter.

use aim_ir::{DType, Tensor};
use std::collections::HashMap;

/// A generated kernel with how to launch it.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The `.entry` symbol.
    pub name: String,
    /// Its PTX text (one `.entry`; [`ptx::module`] adds the header).
    pub ptx: String,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Static shared memory in bytes.
    pub shared_bytes: usize,
    /// The ONNX nodes it computes.
    pub sources: Vec<String>,
}

impl Kernel {
    /// The launch line `aim explore --stage ptx` prints above the kernel.
    pub fn header(&self) -> String {
        format!(
            "// kernel {}: grid ({}, {}, {}) x block ({}, {}, {}), {} B shared",
            self.name,
            self.grid[0],
            self.grid[1],
            self.grid[2],
            self.block[0],
            self.block[1],
            self.block[2],
            self.shared_bytes,
        )
    }
}

/// Where a value lives on the device.
#[derive(Clone, Debug)]
pub enum Storage {
    /// A graph input, copied in before the launches.
    Input,
    /// A constant, uploaded once at load.
    Constant(Tensor),
    /// Bytes of the arena from this offset.
    Arena(usize),
    /// The same bytes as another value (a view).
    Alias(usize),
}

/// A tensor the program reads or writes on the device.
#[derive(Clone, Debug)]
pub struct Value {
    /// The graph value's name (or `node:table` for a kernel's constant table).
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape (every dim known).
    pub shape: Vec<usize>,
    /// Where its bytes are.
    pub storage: Storage,
}

impl Value {
    /// Bytes of the tensor.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// A kernel argument.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// The device address of a value.
    Value(usize),
    /// A 64-bit count.
    U64(u64),
    /// The program's error flag (a device u32 that kernels set to report bad indices).
    ErrorFlag,
}

/// One launch.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Index into [`CudaProgram::kernels`].
    pub kernel: usize,
    /// The kernel's arguments, in parameter order.
    pub args: Vec<Arg>,
    /// The graph node it computes.
    pub node: String,
}

/// A graph lowered for a GPU.
#[derive(Clone, Debug)]
pub struct CudaProgram {
    /// The architecture the PTX was generated for (`sm_<sm>`).
    pub sm: u32,
    /// Every distinct kernel (launches of the same code with the same geometry share one).
    pub kernels: Vec<Kernel>,
    /// Every device value.
    pub values: Vec<Value>,
    /// The launches, in order.
    pub launches: Vec<Launch>,
    /// Values of the graph's inputs, in order.
    pub inputs: Vec<usize>,
    /// Values of the graph's outputs, in order.
    pub outputs: Vec<usize>,
    /// Bytes of the device arena.
    pub arena_bytes: usize,
}

impl CudaProgram {
    /// The module text holding every kernel.
    pub fn module(&self) -> String {
        module(self.sm, &self.kernels.iter().map(|k| k.ptx.as_str()).collect::<Vec<_>>())
    }

    /// The value an alias chain ends at.
    pub fn root(&self, mut v: usize) -> usize {
        while let Storage::Alias(a) = self.values[v].storage {
            v = a;
        }
        v
    }

    /// Every value's device address, given where each value with storage of its own lives
    /// (`place` is not called for aliases, which get their root's address): the one place
    /// where executors (the driver, the interpreter) resolve storage.
    pub fn addresses<E>(&self, mut place: impl FnMut(usize, &Value) -> Result<u64, E>) -> Result<Vec<u64>, E> {
        let mut addr = vec![0u64; self.values.len()];
        for (v, val) in self.values.iter().enumerate() {
            if !matches!(val.storage, Storage::Alias(_)) {
                addr[v] = place(v, val)?;
            }
        }
        for v in 0..self.values.len() {
            addr[v] = addr[self.root(v)];
        }
        Ok(addr)
    }

    /// The 64-bit parameters of `launch`, from the values' addresses and the error flag's.
    pub fn params(&self, launch: &Launch, addr: &[u64], flag: u64) -> Vec<u64> {
        launch
            .args
            .iter()
            .map(|a| match a {
                Arg::Value(v) => addr[*v],
                Arg::U64(n) => *n,
                Arg::ErrorFlag => flag,
            })
            .collect()
    }

    /// The tensor given for input value `v`, checked against the dtype and shape the program
    /// was compiled for (the error says what is wrong; the caller names the input).
    pub fn input<'t>(&self, v: usize, inputs: &'t HashMap<String, Tensor>) -> Result<&'t Tensor, String> {
        let val = &self.values[v];
        let t = inputs.get(&val.name).ok_or("missing")?;
        if t.dtype() != val.dtype || t.shape() != val.shape.as_slice() {
            return Err(format!(
                "{}{:?} given, the program was compiled for {}{:?}",
                t.dtype(),
                t.shape(),
                val.dtype,
                val.shape
            ));
        }
        Ok(t)
    }
}

/// A PTX module: the header for `sm_<sm>` and the kernels' text.
pub fn module(sm: u32, kernels: &[&str]) -> String {
    let mut s = format!(".version {}\n.target sm_{sm}\n.address_size 64\n", PTX_VERSION);
    for k in kernels {
        s.push('\n');
        s.push_str(k);
    }
    s
}

/// The PTX ISA version modules declare: 7.8, the first with sm_90; drivers for CUDA 11.8
/// and later read it.
pub const PTX_VERSION: &str = "7.8";
