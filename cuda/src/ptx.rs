//! A small builder of PTX kernels: typed virtual registers (ptxas allocates the real
//! ones), parameters, shared arrays, labels, and instructions written as PTX text, so
//! each kernel generator reads like the PTX it produces.

use std::fmt::{self, Write};

/// A register class, as PTX declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// `.pred` (`%p`).
    Pred,
    /// `.b32` (`%r`): u32 / s32 / bit patterns of f32.
    B32,
    /// `.b64` (`%rd`): addresses and 64-bit indices.
    B64,
    /// `.f32` (`%f`).
    F32,
    /// `.b16` (`%rs`): f16 / bf16 bit patterns.
    B16,
}

impl Class {
    const ALL: [Class; 5] = [Class::Pred, Class::B32, Class::B64, Class::F32, Class::B16];

    fn prefix(self) -> &'static str {
        match self {
            Class::Pred => "p",
            Class::B32 => "r",
            Class::B64 => "rd",
            Class::F32 => "f",
            Class::B16 => "rs",
        }
    }

    fn decl(self) -> &'static str {
        match self {
            Class::Pred => ".pred",
            Class::B32 => ".b32",
            Class::B64 => ".b64",
            Class::F32 => ".f32",
            Class::B16 => ".b16",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A virtual register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg {
    class: Class,
    n: u32,
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}{}", self.class.prefix(), self.n)
    }
}

/// An f32 immediate in PTX's exact hexadecimal form (`0f3F800000` is 1.0).
pub fn fimm(x: f32) -> String {
    format!("0f{:08X}", x.to_bits())
}

/// An open grid-stride loop ([`Kernel::grid_loop`]).
pub struct GridLoop {
    /// The item this iteration handles (64-bit).
    pub i: Reg,
    total: Reg,
    head: String,
    done: String,
}

/// A kernel being built.
pub struct Kernel {
    name: String,
    params: Vec<(String, &'static str)>,
    counts: [u32; 5],
    shared: Vec<(String, usize)>,
    body: String,
    labels: u32,
}

impl Kernel {
    /// An empty kernel called `name`.
    pub fn new(name: &str) -> Kernel {
        Kernel {
            name: name.to_string(),
            params: Vec::new(),
            counts: [0; 5],
            shared: Vec::new(),
            body: String::new(),
            labels: 0,
        }
    }

    /// The kernel's name (its `.entry` symbol).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Declares a `.u64` parameter (a device pointer) and loads it into a register as a
    /// global address.
    pub fn ptr_param(&mut self, name: &str) -> Reg {
        self.params.push((name.to_string(), ".u64"));
        let p = self.reg(Class::B64);
        self.ins(format!("ld.param.u64 {p}, [{name}];"));
        let g = self.reg(Class::B64);
        self.ins(format!("cvta.to.global.u64 {g}, {p};"));
        g
    }

    /// Declares a `.u64` parameter (a count) and loads it.
    pub fn u64_param(&mut self, name: &str) -> Reg {
        self.params.push((name.to_string(), ".u64"));
        let r = self.reg(Class::B64);
        self.ins(format!("ld.param.u64 {r}, [{name}];"));
        r
    }

    /// Declares a `.u32` parameter and loads it.
    pub fn u32_param(&mut self, name: &str) -> Reg {
        self.params.push((name.to_string(), ".u32"));
        let r = self.reg(Class::B32);
        self.ins(format!("ld.param.u32 {r}, [{name}];"));
        r
    }

    /// Declares a `.f32` parameter and loads it.
    pub fn f32_param(&mut self, name: &str) -> Reg {
        self.params.push((name.to_string(), ".f32"));
        let r = self.reg(Class::F32);
        self.ins(format!("ld.param.f32 {r}, [{name}];"));
        r
    }

    /// Declares a shared array of `bytes` (16-byte aligned) and returns its 32-bit shared
    /// address in a register.
    pub fn shared(&mut self, name: &str, bytes: usize) -> Reg {
        self.shared.push((name.to_string(), bytes));
        let r = self.reg(Class::B32);
        self.ins(format!("mov.u32 {r}, {name};"));
        r
    }

    /// Bytes of shared memory the kernel declares.
    pub fn shared_bytes(&self) -> usize {
        self.shared.iter().map(|s| s.1.next_multiple_of(16)).sum()
    }

    /// A new register of `class`.
    pub fn reg(&mut self, class: Class) -> Reg {
        let n = self.counts[class.index()];
        self.counts[class.index()] += 1;
        Reg { class, n }
    }

    /// A new label name.
    pub fn label(&mut self, hint: &str) -> String {
        self.labels += 1;
        format!("$L_{hint}_{}", self.labels)
    }

    /// Places `label` here.
    pub fn place(&mut self, label: &str) {
        let _ = writeln!(self.body, "{label}:");
    }

    /// Appends one instruction (with its `;`).
    pub fn ins(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(self.body, "\t{}", text.as_ref());
    }

    /// A comment line.
    pub fn comment(&mut self, text: &str) {
        let _ = writeln!(self.body, "\t// {text}");
    }

    /// `d = op.ty a, b` into a new register of `class`.
    pub fn op2(&mut self, class: Class, op: &str, a: impl fmt::Display, b: impl fmt::Display) -> Reg {
        let d = self.reg(class);
        self.ins(format!("{op} {d}, {a}, {b};"));
        d
    }

    /// `d = op.ty a` into a new register of `class`.
    pub fn op1(&mut self, class: Class, op: &str, a: impl fmt::Display) -> Reg {
        let d = self.reg(class);
        self.ins(format!("{op} {d}, {a};"));
        d
    }

    /// `d = op.ty a, b, c` into a new register of `class`.
    pub fn op3(
        &mut self,
        class: Class,
        op: &str,
        a: impl fmt::Display,
        b: impl fmt::Display,
        c: impl fmt::Display,
    ) -> Reg {
        let d = self.reg(class);
        self.ins(format!("{op} {d}, {a}, {b}, {c};"));
        d
    }

    /// An f32 constant in a register.
    pub fn fconst(&mut self, x: f32) -> Reg {
        self.op1(Class::F32, "mov.f32", fimm(x))
    }

    /// The global thread index `ctaid.x · ntid.x + tid.x` and the grid's thread count, as
    /// 64-bit values.
    pub fn global_index(&mut self) -> (Reg, Reg) {
        let tid = self.op1(Class::B32, "mov.u32", "%tid.x");
        let ctaid = self.op1(Class::B32, "mov.u32", "%ctaid.x");
        let ntid = self.op1(Class::B32, "mov.u32", "%ntid.x");
        let nctaid = self.op1(Class::B32, "mov.u32", "%nctaid.x");
        let i = self.op3(Class::B32, "mad.lo.u32", ctaid, ntid, tid);
        let total = self.op2(Class::B32, "mul.lo.u32", nctaid, ntid);
        let i = self.op1(Class::B64, "cvt.u64.u32", i);
        let total = self.op1(Class::B64, "cvt.u64.u32", total);
        (i, total)
    }

    /// Opens a grid-stride loop over `n` items (a register or a constant): each thread
    /// starts at its global index and steps by the grid's thread count; the body follows,
    /// and [`Kernel::end_grid_loop`] closes it (and the kernel).
    pub fn grid_loop(&mut self, n: impl fmt::Display) -> GridLoop {
        let (i, total) = self.global_index();
        let (head, done) = (self.label("loop"), self.label("done"));
        self.place(&head);
        let past = self.op2(Class::Pred, "setp.ge.u64", i, n);
        self.ins(format!("@{past} bra {done};"));
        GridLoop { i, total, head, done }
    }

    /// Closes a grid-stride loop and returns from the kernel.
    pub fn end_grid_loop(&mut self, l: GridLoop) {
        let GridLoop { i, total, head, done } = l;
        self.ins(format!("add.s64 {i}, {i}, {total};"));
        self.ins(format!("bra.uni {head};"));
        self.place(&done);
        self.ins("ret;");
    }

    /// The coordinates of linear index `i` (of class `class`: `B32` or `B64`) over dims
    /// whose inner sizes are `inner` (the innermost last): `[i / Π inner, c_1, ..., c_k]`,
    /// outermost first.
    pub fn coords(&mut self, class: Class, i: Reg, inner: &[u64]) -> Vec<Reg> {
        let (rem, div) = if class == Class::B64 { ("rem.u64", "div.u64") } else { ("rem.u32", "div.u32") };
        let mut out = Vec::with_capacity(inner.len() + 1);
        let mut rest = i;
        for &d in inner.iter().rev() {
            out.push(self.op2(class, rem, rest, d));
            rest = self.op2(class, div, rest, d);
        }
        out.push(rest);
        out.reverse();
        out
    }

    /// The address `base + 4·i` of f32 element `i` (64-bit index).
    pub fn f32_addr(&mut self, base: Reg, i: Reg) -> Reg {
        let off = self.op2(Class::B64, "shl.b64", i, 2);
        self.op2(Class::B64, "add.s64", base, off)
    }

    /// The kernel as PTX text (one `.entry`).
    pub fn finish(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, ".visible .entry {}(", self.name);
        for (k, (name, ty)) in self.params.iter().enumerate() {
            let sep = if k + 1 < self.params.len() { "," } else { "" };
            let _ = writeln!(s, "\t.param {ty} {name}{sep}");
        }
        let _ = writeln!(s, ")\n{{");
        for c in Class::ALL {
            let n = self.counts[c.index()];
            if n > 0 {
                let _ = writeln!(s, "\t.reg {} %{}<{n}>;", c.decl(), c.prefix());
            }
        }
        for (name, bytes) in &self.shared {
            let _ = writeln!(s, "\t.shared .align 16 .b8 {name}[{}];", bytes.max(&16));
        }
        s.push_str(&self.body);
        s.push_str("}\n");
        s
    }
}

/// A PTX module: the header for `sm` and the kernels' text.
pub fn module(sm: u32, kernels: &[String]) -> String {
    aim_runtime::cuda::module(sm, &kernels.iter().map(String::as_str).collect::<Vec<_>>())
}
