//! Running kernels: blocks one after another; inside a block every thread runs until it
//! reaches a barrier, a warp collective or its end, then collectives and barriers are
//! released when all the threads they wait for have arrived.

use crate::parse::{Base, Cmp, Inst, Kernel, Module, Op, Operand, Round, Shfl, Space, Special, Ty};

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// No kernel of that name.
    #[error("no kernel '{0}' in the module")]
    NoKernel(String),
    /// The arguments do not match the parameters.
    #[error("kernel '{kernel}': {msg}")]
    Args {
        /// The kernel.
        kernel: String,
        /// What does not match.
        msg: String,
    },
    /// An access outside every buffer, a misaligned one, a division by zero, ...
    #[error("kernel '{kernel}', block {block:?}, thread {thread:?}, PTX line {line}: {msg}")]
    Fault {
        /// The kernel.
        kernel: String,
        /// The block's `%ctaid`.
        block: [u32; 3],
        /// The thread's `%tid`.
        thread: [u32; 3],
        /// The instruction's line in the module text.
        line: usize,
        /// What went wrong.
        msg: String,
    },
    /// Threads wait for each other forever (divergent barrier or collective).
    #[error("kernel '{kernel}', block {block:?}: {msg}")]
    Stuck {
        /// The kernel.
        kernel: String,
        /// The block's `%ctaid`.
        block: [u32; 3],
        /// Who waits for what.
        msg: String,
    },
}

/// Grid and block dimensions of a launch.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A `.u64` value: a device address from [`Memory::alloc`], or a count.
    U64(u64),
    /// A `.u32` value.
    U32(u32),
    /// A `.f32` value.
    F32(f32),
}

/// What a launch executed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Instructions executed, summed over threads.
    pub instructions: u64,
}

/// Global memory: buffers at addresses `(index + 1) << 40`, each access checked.
#[derive(Default)]
pub struct Memory {
    bufs: Vec<Vec<u8>>,
}

const SHIFT: u32 = 40;

impl Memory {
    /// Empty memory.
    pub fn new() -> Memory {
        Memory::default()
    }

    /// A zeroed buffer of `bytes`; its device address.
    pub fn alloc(&mut self, bytes: usize) -> u64 {
        self.bufs.push(vec![0; bytes]);
        (self.bufs.len() as u64) << SHIFT
    }

    /// A buffer holding `data`; its address.
    pub fn upload(&mut self, data: &[f32]) -> u64 {
        let a = self.alloc(data.len() * 4);
        let b = self.bufs.last_mut().expect("just pushed");
        for (k, v) in data.iter().enumerate() {
            b[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
        }
        a
    }

    /// A buffer holding `bytes`; its address.
    pub fn upload_bytes(&mut self, bytes: &[u8]) -> u64 {
        let a = self.alloc(bytes.len());
        self.bufs.last_mut().expect("just pushed").copy_from_slice(bytes);
        a
    }

    /// `len` bytes from `addr` (an address inside a buffer), or why not.
    pub fn read_bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0; len];
        if len > 0 {
            let (b, off) = self.range(addr, len.min(1))?;
            let buf = &self.bufs[b];
            if off + len > buf.len() {
                return Err(format!("{len} bytes at {addr:#x} run past the buffer"));
            }
            out.copy_from_slice(&buf[off..off + len]);
        }
        Ok(out)
    }

    /// The f32 contents of the buffer at `addr`.
    pub fn download(&self, addr: u64) -> Vec<f32> {
        let b = &self.bufs[((addr >> SHIFT) - 1) as usize];
        b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    fn range(&self, addr: u64, len: usize) -> Result<(usize, usize), String> {
        let id = (addr >> SHIFT) as usize;
        let off = (addr & ((1 << SHIFT) - 1)) as usize;
        let ok = id >= 1 && id <= self.bufs.len() && off.checked_add(len).is_some_and(|e| e <= self.bufs[id - 1].len());
        if !ok {
            return Err(format!("global access of {len} bytes at {addr:#x} is outside every buffer"));
        }
        if !addr.is_multiple_of(len.min(16) as u64) {
            return Err(format!("misaligned global access of {len} bytes at {addr:#x}"));
        }
        Ok((id - 1, off))
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        let (b, off) = self.range(addr, out.len())?;
        out.copy_from_slice(&self.bufs[b][off..off + out.len()]);
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String> {
        let (b, off) = self.range(addr, data.len())?;
        self.bufs[b][off..off + data.len()].copy_from_slice(data);
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Ready,
    AtBarrier,
    AtCollective,
    Done,
}

struct Thread {
    pc: usize,
    regs: Vec<u64>,
    state: State,
    tid: [u32; 3],
}

/// The most instructions one launch may execute (a loop that does not end is an error).
const STEP_LIMIT: u64 = 4_000_000_000;

struct Block<'a> {
    k: &'a Kernel,
    name: &'a str,
    params: &'a [u64],
    launch: Launch,
    ctaid: [u32; 3],
    shared: Vec<u8>,
    steps: u64,
}

#[inline(always)]
fn lo(v: u64) -> u32 {
    v as u32
}

#[inline(always)]
fn f(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

#[inline(always)]
fn fb(x: f32) -> u64 {
    u64::from(x.to_bits())
}

/// IEEE maximum/minimum with −0 < +0; `nan`: NaN if either is NaN, else the other operand.
fn fminmax(a: f32, b: f32, max: bool, nan: bool) -> f32 {
    if a.is_nan() || b.is_nan() {
        return if nan || (a.is_nan() && b.is_nan()) {
            f32::NAN
        } else if a.is_nan() {
            b
        } else {
            a
        };
    }
    if a == b {
        // ±0: max prefers +0, min −0.
        return if max == a.is_sign_positive() { a } else { b };
    }
    if (a > b) == max {
        a
    } else {
        b
    }
}

fn tf32_round(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits((x.to_bits().wrapping_add(0x1000)) & !0x1fff)
}

fn float_to_int(x: f32, round: Round, ty: Ty) -> u64 {
    let r = match round {
        Round::Rni => x.round_ties_even(),
        Round::Rmi => x.floor(),
        _ => x.trunc(),
    };
    if r.is_nan() {
        return 0;
    }
    match ty {
        Ty::S32 => (r.clamp(i32::MIN as f32, i32::MAX as f32) as i32) as u32 as u64,
        Ty::U32 => r.clamp(0.0, u32::MAX as f32) as u32 as u64,
        Ty::S64 => (r as i64) as u64,
        _ => r.max(0.0) as u64,
    }
}

impl Block<'_> {
    fn fault(&self, t: &Thread, inst: &Inst, msg: String) -> ExecError {
        ExecError::Fault { kernel: self.name.to_string(), block: self.ctaid, thread: t.tid, line: inst.line, msg }
    }

    #[inline(always)]
    fn special(&self, t: &Thread, s: Special) -> u64 {
        u64::from(match s {
            Special::Tid(d) => t.tid[d as usize],
            Special::Ntid(d) => self.launch.block[d as usize],
            Special::Ctaid(d) => self.ctaid[d as usize],
            Special::Nctaid(d) => self.launch.grid[d as usize],
            Special::LaneId => self.linear(t.tid) % 32,
        })
    }

    #[inline(always)]
    fn linear(&self, tid: [u32; 3]) -> u32 {
        let b = self.launch.block;
        tid[0] + b[0] * (tid[1] + b[1] * tid[2])
    }

    #[inline(always)]
    fn value(&self, t: &Thread, o: &Operand) -> u64 {
        match o {
            Operand::Reg(r) => t.regs[*r as usize],
            Operand::Imm(v) => *v,
            Operand::Special(s) => self.special(t, *s),
            Operand::Shared(off) => u64::from(*off),
            Operand::Addr(..) | Operand::Vec(_) | Operand::Label(_) => 0,
        }
    }

    #[inline(always)]
    fn address(&self, t: &Thread, o: &Operand) -> u64 {
        match o {
            Operand::Addr(Base::Reg(r), off) => t.regs[*r as usize].wrapping_add(*off as u64),
            Operand::Addr(Base::Shared(s), off) => u64::from(*s).wrapping_add(*off as u64),
            _ => 0,
        }
    }

    fn shared_range(&self, addr: u64, len: usize) -> Result<usize, String> {
        let a = addr as usize;
        if addr > u64::from(u32::MAX) || a.checked_add(len).is_none_or(|e| e > self.shared.len()) {
            return Err(format!(
                "shared access of {len} bytes at {addr:#x} is outside the block's {} bytes",
                self.shared.len()
            ));
        }
        if !a.is_multiple_of(len.min(16)) {
            return Err(format!("misaligned shared access of {len} bytes at {addr:#x}"));
        }
        Ok(a)
    }

    fn set(t: &mut Thread, o: &Operand, v: u64) {
        if let Operand::Reg(r) = o {
            t.regs[*r as usize] = v;
        }
    }

    /// Runs `t` until it reaches a barrier, a collective, or its end.
    fn run(&mut self, t: &mut Thread, mem: &mut Memory) -> Result<(), ExecError> {
        let code = &self.k.code;
        loop {
            let Some(inst) = code.get(t.pc) else {
                t.state = State::Done;
                return Ok(());
            };
            self.steps += 1;
            if self.steps > STEP_LIMIT {
                return Err(self.fault(t, inst, format!("more than {STEP_LIMIT} instructions: a loop does not end")));
            }
            if let Some((p, neg)) = inst.guard {
                if (t.regs[p as usize] != 0) == neg {
                    t.pc += 1;
                    continue;
                }
            }
            match inst.op {
                Op::BarSync => {
                    t.state = State::AtBarrier;
                    return Ok(());
                }
                op if op.warp_collective() => {
                    t.state = State::AtCollective;
                    return Ok(());
                }
                Op::Ret => {
                    t.state = State::Done;
                    return Ok(());
                }
                Op::Bra => {
                    let Operand::Label(pc) = inst.args[0] else { return Err(self.fault(t, inst, "bad branch".into())) };
                    t.pc = pc;
                    continue;
                }
                _ => self.step(t, inst, mem).map_err(|m| self.fault(t, inst, m))?,
            }
            t.pc += 1;
        }
    }

    /// One ordinary instruction.
    fn step(&mut self, t: &mut Thread, inst: &Inst, mem: &mut Memory) -> Result<(), String> {
        let a = &inst.args;
        if matches!(inst.op, Op::CpCommit | Op::CpWait) {
            return Ok(());
        }
        let v = |k: usize| self.value(t, &a[k]);
        let d = &a[0];
        let r: u64 = match inst.op {
            Op::Mov(ty) => mask(v(1), ty),
            Op::LdParam(_) => match a[1] {
                Operand::Addr(Base::Param(p), 0) => self.params[p as usize],
                _ => return Err("ld.param reads a parameter by name".into()),
            },
            Op::Cvta => v(1),
            Op::Ld { space, ty, width } => {
                let addr = self.address(t, &a[1]);
                let n = ty.bytes() * width as usize;
                let mut buf = [0u8; 32];
                match space {
                    Space::Global => mem.read(addr, &mut buf[..n])?,
                    Space::Shared => {
                        let s = self.shared_range(addr, n)?;
                        buf[..n].copy_from_slice(&self.shared[s..s + n]);
                    }
                }
                let one;
                let regs: &[u32] = match d {
                    Operand::Vec(r) => r,
                    Operand::Reg(r) => {
                        one = [*r];
                        &one
                    }
                    _ => return Err("load into a non-register".into()),
                };
                if regs.len() != width as usize {
                    return Err("vector width and registers differ".into());
                }
                for (k, r) in regs.iter().enumerate() {
                    let s = ty.bytes();
                    let mut x = [0u8; 8];
                    x[..s].copy_from_slice(&buf[k * s..k * s + s]);
                    let v = u64::from_le_bytes(x);
                    t.regs[*r as usize] = if ty == Ty::S8 { v as u8 as i8 as i32 as u32 as u64 } else { v };
                }
                return Ok(());
            }
            Op::St { space, ty, width } => {
                let addr = self.address(t, &a[0]);
                let s = ty.bytes();
                let mut buf = [0u8; 32];
                let mut len = 0;
                let mut put = |x: u64| {
                    buf[len..len + s].copy_from_slice(&x.to_le_bytes()[..s]);
                    len += s;
                };
                match &a[1] {
                    Operand::Vec(r) if r.len() == width as usize => r.iter().for_each(|r| put(t.regs[*r as usize])),
                    o if width == 1 => put(self.value(t, o)),
                    _ => return Err("vector width and registers differ".into()),
                }
                let buf = &buf[..len];
                match space {
                    Space::Global => mem.write(addr, buf)?,
                    Space::Shared => {
                        let o = self.shared_range(addr, buf.len())?;
                        self.shared[o..o + buf.len()].copy_from_slice(buf);
                    }
                }
                return Ok(());
            }
            Op::Add(Ty::F32) => fb(f(v(1)) + f(v(2))),
            Op::Sub(Ty::F32) => fb(f(v(1)) - f(v(2))),
            Op::MulLo(Ty::F32) => fb(f(v(1)) * f(v(2))),
            Op::Div(Ty::F32) => fb(f(v(1)) / f(v(2))),
            Op::Fma => fb(f(v(1)).mul_add(f(v(2)), f(v(3)))),
            Op::Min(Ty::F32, nan) => fb(fminmax(f(v(1)), f(v(2)), false, nan)),
            Op::Max(Ty::F32, nan) => fb(fminmax(f(v(1)), f(v(2)), true, nan)),
            Op::Neg(Ty::F32) => fb(-f(v(1))),
            Op::Abs(Ty::F32) => fb(f(v(1)).abs()),
            Op::Sqrt => fb(f(v(1)).sqrt()),
            Op::Lg2 => fb(f(v(1)).log2()),
            Op::Rcp => fb(1.0 / f(v(1))),
            Op::Add(ty) => mask(v(1).wrapping_add(v(2)), ty),
            Op::Sub(ty) => mask(v(1).wrapping_sub(v(2)), ty),
            Op::MulLo(ty) => mask(v(1).wrapping_mul(v(2)), ty),
            Op::Mad(ty) => mask(v(1).wrapping_mul(v(2)).wrapping_add(v(3)), ty),
            Op::MulWide(ty) => match ty {
                Ty::S32 => ((lo(v(1)) as i32 as i64) * (lo(v(2)) as i32 as i64)) as u64,
                _ => u64::from(lo(v(1))) * u64::from(lo(v(2))),
            },
            Op::Div(ty) | Op::Rem(ty) => {
                let (x, y) = (mask(v(1), ty), mask(v(2), ty));
                if y == 0 {
                    return Err("integer division by zero".into());
                }
                let rem = matches!(inst.op, Op::Rem(_));
                match ty {
                    Ty::S32 => {
                        let (x, y) = (x as u32 as i32, y as u32 as i32);
                        (if rem { x.wrapping_rem(y) } else { x.wrapping_div(y) }) as u32 as u64
                    }
                    Ty::S64 => {
                        let (x, y) = (x as i64, y as i64);
                        (if rem { x.wrapping_rem(y) } else { x.wrapping_div(y) }) as u64
                    }
                    _ => {
                        if rem {
                            x % y
                        } else {
                            x / y
                        }
                    }
                }
            }
            Op::Min(ty, _) | Op::Max(ty, _) => {
                let max = matches!(inst.op, Op::Max(..));
                let (x, y) = (mask(v(1), ty), mask(v(2), ty));
                let less = if ty.signed() { sext(x, ty) < sext(y, ty) } else { x < y };
                if less == max {
                    y
                } else {
                    x
                }
            }
            Op::Neg(ty) => mask(0u64.wrapping_sub(v(1)), ty),
            Op::Abs(ty) => mask(sext(v(1), ty).unsigned_abs(), ty),
            Op::Shl(ty) => mask(v(1).checked_shl(lo(v(2))).unwrap_or(0), ty),
            Op::Shr(ty) => {
                let (bits, s) = (if ty.wide() { 64 } else { 32 }, lo(v(2)));
                if ty.signed() {
                    mask((sext(v(1), ty) >> s.min(bits - 1)) as u64, ty)
                } else if s >= bits {
                    0
                } else {
                    mask(v(1), ty) >> s
                }
            }
            Op::And(ty) => mask(v(1) & v(2), ty),
            Op::Or(ty) => mask(v(1) | v(2), ty),
            Op::Xor(ty) => mask(v(1) ^ v(2), ty),
            Op::Not(Ty::Pred) => u64::from(v(1) == 0),
            Op::Not(ty) => mask(!v(1), ty),
            Op::Cvt { dst, src, round } => cvt(v(1), dst, src, round),
            Op::CvtPack(bf16) => {
                let h = |x: u64| u64::from(half_bits(f(x), bf16));
                (h(v(1)) << 16) | h(v(2))
            }
            Op::Setp(cmp, ty) => {
                let (x, y) = (v(1), v(2));
                let ord = if ty == Ty::F32 {
                    f(x).partial_cmp(&f(y))
                } else if ty.signed() {
                    Some(sext(x, ty).cmp(&sext(y, ty)))
                } else {
                    Some(mask(x, ty).cmp(&mask(y, ty)))
                };
                use std::cmp::Ordering::*;
                u64::from(match (cmp, ord) {
                    (Cmp::Ne, None) => false,
                    (Cmp::Neu, None) => true,
                    (Cmp::Neu, Some(o)) => o != Equal,
                    (_, None) => false,
                    (Cmp::Eq, Some(o)) => o == Equal,
                    (Cmp::Ne, Some(o)) => o != Equal,
                    (Cmp::Lt, Some(o)) => o == Less,
                    (Cmp::Le, Some(o)) => o != Greater,
                    (Cmp::Gt, Some(o)) => o == Greater,
                    (Cmp::Ge, Some(o)) => o != Less,
                })
            }
            Op::Selp(_) => {
                if v(3) != 0 {
                    v(1)
                } else {
                    v(2)
                }
            }
            Op::CpAsync => {
                let (dst, src) = (self.address(t, &a[0]), self.address(t, &a[1]));
                let n = v(2) as usize;
                let from = if a.len() == 4 { (v(3) as usize).min(n) } else { n };
                let o = self.shared_range(dst, n)?;
                let mut buf = vec![0u8; n];
                if from > 0 {
                    mem.read(src, &mut buf[..from])?;
                }
                self.shared[o..o + n].copy_from_slice(&buf);
                return Ok(());
            }
            op => return Err(format!("{op:?} is not executed here")),
        };
        Block::set(t, d, r);
        Ok(())
    }

    /// Executes the collective every live lane of a warp waits at.
    fn collective(&self, lanes: &mut [&mut Thread]) -> Result<(), ExecError> {
        let pc = lanes[0].pc;
        let inst = &self.k.code[pc];
        if let Some(t) = lanes.iter().find(|t| t.pc != pc) {
            return Err(self.fault(t, inst, "lanes of one warp wait at different collectives".into()));
        }
        let lane = |t: &Thread| self.linear(t.tid) % 32;
        match inst.op {
            Op::Shfl(mode) => {
                let a = &inst.args;
                let src: Vec<(u32, u64)> = lanes.iter().map(|t| (lane(t), self.value(t, &a[1]))).collect();
                let get = |l: u32| src.iter().find(|s| s.0 == l).map(|s| s.1);
                for t in lanes.iter_mut() {
                    let (me, b) = (lane(t), lo(self.value(t, &a[2])));
                    let from = match mode {
                        Shfl::Bfly => me ^ b,
                        Shfl::Idx => b & 31,
                        Shfl::Down => me + b,
                        Shfl::Up => me.wrapping_sub(b),
                    };
                    let own = self.value(t, &a[1]);
                    let v = if from < 32 { get(from).unwrap_or(own) } else { own };
                    Block::set(t, &a[0], v);
                }
            }
            Op::MmaTf32 | Op::MmaHalf(_) => {
                if lanes.len() != 32 {
                    return Err(self.fault(lanes[0], inst, "mma.sync needs all 32 lanes of the warp".into()));
                }
                let regs = |o: &Operand| match o {
                    Operand::Vec(r) => r.clone(),
                    _ => Vec::new(),
                };
                let (d, ar, br, cr) =
                    (regs(&inst.args[0]), regs(&inst.args[1]), regs(&inst.args[2]), regs(&inst.args[3]));
                if d.len() != 4 || ar.len() != 4 || br.len() != 2 || cr.len() != 4 {
                    return Err(self.fault(lanes[0], inst, "mma.sync m16n8 takes {4}, {4}, {2}, {4}".into()));
                }
                // A is 16×K and B K×8: K = 8 (tf32, one element a register) or 16 (two halves a
                // register, the lower half first).
                let kdim = if inst.op == Op::MmaTf32 { 8 } else { 16 };
                let (mut am, mut bm, mut cm) = ([[0f32; 16]; 16], [[0f32; 8]; 16], [[0f32; 8]; 16]);
                let t32 = |x: u64| f32::from_bits(lo(x) & !0x1fff);
                for t in lanes.iter() {
                    let l = lane(t) as usize;
                    let (g, q) = (l / 4, l % 4);
                    let rv = |r: u32| t.regs[r as usize];
                    match inst.op {
                        Op::MmaHalf(bf16) => {
                            let pair = |r: u32| {
                                let w = lo(rv(r));
                                (half_value(w as u16, bf16), half_value((w >> 16) as u16, bf16))
                            };
                            for (k, (row, col)) in
                                [(g, 2 * q), (g + 8, 2 * q), (g, 2 * q + 8), (g + 8, 2 * q + 8)].into_iter().enumerate()
                            {
                                (am[row][col], am[row][col + 1]) = pair(ar[k]);
                            }
                            (bm[2 * q][g], bm[2 * q + 1][g]) = pair(br[0]);
                            (bm[2 * q + 8][g], bm[2 * q + 9][g]) = pair(br[1]);
                        }
                        _ => {
                            am[g][q] = t32(rv(ar[0]));
                            am[g + 8][q] = t32(rv(ar[1]));
                            am[g][q + 4] = t32(rv(ar[2]));
                            am[g + 8][q + 4] = t32(rv(ar[3]));
                            bm[q][g] = t32(rv(br[0]));
                            bm[q + 4][g] = t32(rv(br[1]));
                        }
                    }
                    cm[g][2 * q] = f(rv(cr[0]));
                    cm[g][2 * q + 1] = f(rv(cr[1]));
                    cm[g + 8][2 * q] = f(rv(cr[2]));
                    cm[g + 8][2 * q + 1] = f(rv(cr[3]));
                }
                let mut dm = [[0f32; 8]; 16];
                for (i, row) in dm.iter_mut().enumerate() {
                    for (j, out) in row.iter_mut().enumerate() {
                        let s: f64 = (0..kdim).map(|k| f64::from(am[i][k]) * f64::from(bm[k][j])).sum();
                        *out = (s + f64::from(cm[i][j])) as f32;
                    }
                }
                for t in lanes.iter_mut() {
                    let l = lane(t) as usize;
                    let (g, q) = (l / 4, l % 4);
                    for (k, (i, j)) in
                        [(g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1)].into_iter().enumerate()
                    {
                        t.regs[d[k] as usize] = fb(dm[i][j]);
                    }
                }
            }
            _ => unreachable!("only collectives wait here"),
        }
        for t in lanes.iter_mut() {
            t.pc += 1;
            t.state = State::Ready;
        }
        Ok(())
    }
}

/// The bits of `x` rounded to nearest even as f16 (or bf16).
fn half_bits(x: f32, bf16: bool) -> u16 {
    if bf16 {
        half::bf16::from_f32(x).to_bits()
    } else {
        half::f16::from_f32(x).to_bits()
    }
}

/// The value of f16 (or bf16) bits.
fn half_value(bits: u16, bf16: bool) -> f32 {
    if bf16 {
        half::bf16::from_bits(bits).to_f32()
    } else {
        half::f16::from_bits(bits).to_f32()
    }
}

#[inline(always)]
fn mask(v: u64, ty: Ty) -> u64 {
    match ty {
        Ty::Pred => u64::from(v != 0),
        t if t.wide() => v,
        Ty::U16 | Ty::B16 | Ty::F16 | Ty::Bf16 => v & 0xffff,
        _ => v & 0xffff_ffff,
    }
}

#[inline(always)]
fn sext(v: u64, ty: Ty) -> i64 {
    if ty.wide() {
        v as i64
    } else {
        v as u32 as i32 as i64
    }
}

fn cvt(x: u64, dst: Ty, src: Ty, round: Round) -> u64 {
    match (dst, src) {
        (Ty::F32, Ty::F16) => fb(half_value(x as u16, false)),
        (Ty::F32, Ty::Bf16) => fb(half_value(x as u16, true)),
        (Ty::F16, Ty::F32) => u64::from(half_bits(f(x), false)),
        (Ty::Bf16, Ty::F32) => u64::from(half_bits(f(x), true)),
        (Ty::F32, Ty::F32) => fb(match round {
            Round::Rni => f(x).round_ties_even(),
            Round::Rzi => f(x).trunc(),
            Round::Rmi => f(x).floor(),
            _ => f(x),
        }),
        (Ty::Tf32, Ty::F32) => fb(tf32_round(f(x))),
        (Ty::F32, s) => fb(if s.signed() { sext(x, s) as f32 } else { mask(x, s) as f32 }),
        (d, Ty::F32) => float_to_int(f(x), round, d),
        (d, s) => {
            let v = if s.signed() { sext(x, s) as u64 } else { mask(x, s) };
            mask(v, d)
        }
    }
}

impl Module {
    /// Runs kernel `name` over `launch` with `args` against `mem`.
    pub fn launch(&self, name: &str, launch: Launch, args: &[Arg], mem: &mut Memory) -> Result<Stats, ExecError> {
        let k = self.kernels.get(name).ok_or_else(|| ExecError::NoKernel(name.to_string()))?;
        let bad = |msg: String| ExecError::Args { kernel: name.to_string(), msg };
        if args.len() != k.params.len() {
            return Err(bad(format!("{} parameters, {} arguments", k.params.len(), args.len())));
        }
        let mut params = Vec::with_capacity(args.len());
        for (k, (a, ty)) in args.iter().zip(&k.params).enumerate() {
            params.push(match (a, ty) {
                (Arg::U64(v), Ty::U64 | Ty::B64 | Ty::S64) => *v,
                (Arg::U32(v), Ty::U32 | Ty::B32 | Ty::S32) => u64::from(*v),
                (Arg::F32(v), Ty::F32) => fb(*v),
                _ => return Err(bad(format!("argument {k} is {a:?}, the parameter {ty:?}"))),
            });
        }
        let threads = launch.block.iter().map(|&d| d as usize).product::<usize>();
        if threads == 0 || threads > 1024 || launch.grid.contains(&0) {
            return Err(bad(format!("launch {launch:?}: 1 to 1024 threads per block, every grid dim ≥ 1")));
        }
        let mut stats = Stats::default();
        for bz in 0..launch.grid[2] {
            for by in 0..launch.grid[1] {
                for bx in 0..launch.grid[0] {
                    let mut b = Block {
                        k,
                        name,
                        params: &params,
                        launch,
                        ctaid: [bx, by, bz],
                        shared: vec![0; k.shared_bytes as usize],
                        steps: 0,
                    };
                    b.run_block(mem)?;
                    stats.instructions += b.steps;
                }
            }
        }
        Ok(stats)
    }
}

impl Block<'_> {
    fn run_block(&mut self, mem: &mut Memory) -> Result<(), ExecError> {
        let [bx, by, bz] = self.launch.block;
        let mut threads: Vec<Thread> = Vec::with_capacity((bx * by * bz) as usize);
        for z in 0..bz {
            for y in 0..by {
                for x in 0..bx {
                    threads.push(Thread {
                        pc: 0,
                        regs: vec![0; self.k.regs as usize],
                        state: State::Ready,
                        tid: [x, y, z],
                    });
                }
            }
        }
        loop {
            let mut progress = false;
            for t in threads.iter_mut() {
                if t.state == State::Ready {
                    self.run(t, mem)?;
                    progress = true;
                }
            }
            for warp in threads.chunks_mut(32) {
                let waiting = warp.iter().filter(|t| t.state == State::AtCollective).count();
                let live = warp.iter().filter(|t| t.state != State::Done).count();
                if waiting > 0 && waiting == live {
                    let mut lanes: Vec<&mut Thread> = warp.iter_mut().filter(|t| t.state != State::Done).collect();
                    self.collective(&mut lanes)?;
                    progress = true;
                }
            }
            let live = threads.iter().filter(|t| t.state != State::Done).count();
            if live == 0 {
                return Ok(());
            }
            if threads.iter().filter(|t| t.state == State::AtBarrier).count() == live {
                for t in threads.iter_mut().filter(|t| t.state == State::AtBarrier) {
                    t.pc += 1;
                    t.state = State::Ready;
                }
                progress = true;
            }
            if !progress {
                return Err(ExecError::Stuck {
                    kernel: self.name.to_string(),
                    block: self.ctaid,
                    msg: "threads wait at a barrier or collective that others never reach".into(),
                });
            }
        }
    }
}
