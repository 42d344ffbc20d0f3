//! Reading PTX text into kernels of decoded instructions: registers numbered, labels
//! resolved, opcodes and their type suffixes decoded once, so execution does no string
//! work.

use std::collections::HashMap;

/// Why a module could not be read.
#[derive(Debug, thiserror::Error)]
#[error("PTX line {line}: {msg}")]
pub struct ParseError {
    /// 1-based line of the module text.
    pub line: usize,
    /// What is wrong there.
    pub msg: String,
}

/// A value type of an instruction suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    U32,
    S32,
    B32,
    U64,
    S64,
    B64,
    F32,
    Pred,
    Tf32,
    U8,
    S8,
    U16,
    B16,
    F16,
    Bf16,
}

impl Ty {
    fn parse(s: &str) -> Option<Ty> {
        Some(match s {
            "u32" => Ty::U32,
            "s32" => Ty::S32,
            "b32" => Ty::B32,
            "u64" => Ty::U64,
            "s64" => Ty::S64,
            "b64" => Ty::B64,
            "f32" => Ty::F32,
            "pred" => Ty::Pred,
            "tf32" => Ty::Tf32,
            "u8" => Ty::U8,
            "s8" => Ty::S8,
            "u16" => Ty::U16,
            "b16" => Ty::B16,
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            _ => return None,
        })
    }

    /// Bytes of a value in memory.
    pub(crate) fn bytes(self) -> usize {
        match self {
            Ty::U64 | Ty::S64 | Ty::B64 => 8,
            Ty::U8 | Ty::S8 => 1,
            Ty::U16 | Ty::B16 | Ty::F16 | Ty::Bf16 => 2,
            _ => 4,
        }
    }

    pub(crate) fn wide(self) -> bool {
        self.bytes() == 8
    }

    pub(crate) fn signed(self) -> bool {
        matches!(self, Ty::S32 | Ty::S64 | Ty::S8)
    }
}

/// A state space of a load or store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    Global,
    Shared,
}

/// A comparison of `setp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    /// Not equal, or unordered (a NaN operand).
    Neu,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A rounding modifier of `cvt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Round {
    None,
    /// To nearest even (float results).
    Rn,
    /// To nearest, ties away (`cvt.rna.tf32.f32`).
    Rna,
    /// To the nearest integer, ties even.
    Rni,
    /// Towards zero, to an integer.
    Rzi,
    /// Towards −∞, to an integer.
    Rmi,
}

/// How `shfl.sync` picks its source lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shfl {
    Bfly,
    Idx,
    Down,
    Up,
}

/// A decoded opcode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Op {
    Mov(Ty),
    LdParam(Ty),
    Cvta,
    Ld {
        space: Space,
        ty: Ty,
        width: u8,
    },
    St {
        space: Space,
        ty: Ty,
        width: u8,
    },
    Add(Ty),
    Sub(Ty),
    MulLo(Ty),
    MulWide(Ty),
    Mad(Ty),
    Fma,
    Div(Ty),
    Rem(Ty),
    Min(Ty, bool),
    Max(Ty, bool),
    Neg(Ty),
    Abs(Ty),
    Sqrt,
    /// `lg2.approx.f32`, computed as the correctly rounded log2 (within the hardware's
    /// stated error).
    Lg2,
    Rcp,
    Shl(Ty),
    Shr(Ty),
    And(Ty),
    Or(Ty),
    Xor(Ty),
    Not(Ty),
    Cvt {
        dst: Ty,
        src: Ty,
        round: Round,
    },
    Setp(Cmp, Ty),
    Selp(Ty),
    Bra,
    Ret,
    BarSync,
    Shfl(Shfl),
    MmaTf32,
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32` (true: bf16).
    MmaHalf(bool),
    /// `cvt.rn.{f16x2,bf16x2}.f32 d, a, b` (true: bf16): `a` rounded into the upper half of
    /// `d`, `b` into the lower.
    CvtPack(bool),
    CpAsync,
    CpCommit,
    CpWait,
}

impl Op {
    /// Whether the op is executed by a whole warp at once.
    pub(crate) fn warp_collective(self) -> bool {
        matches!(self, Op::Shfl(_) | Op::MmaTf32 | Op::MmaHalf(_))
    }
}

/// A special register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Special {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
}

/// The base of an address operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    Reg(u32),
    /// A shared array: its offset in the block's shared memory.
    Shared(u32),
    /// A kernel parameter, by position.
    Param(u32),
}

/// An operand.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Operand {
    Reg(u32),
    Imm(u64),
    Special(Special),
    /// A shared array's address.
    Shared(u32),
    Addr(Base, i64),
    Vec(Vec<u32>),
    Label(usize),
}

/// One instruction.
#[derive(Clone, Debug)]
pub(crate) struct Inst {
    /// The guard predicate register and whether it is negated.
    pub(crate) guard: Option<(u32, bool)>,
    pub(crate) op: Op,
    pub(crate) args: Vec<Operand>,
    /// Its line in the module text.
    pub(crate) line: usize,
}

/// A kernel: its parameters, registers, shared memory and code.
#[derive(Clone, Debug)]
pub(crate) struct Kernel {
    pub(crate) params: Vec<Ty>,
    pub(crate) regs: u32,
    pub(crate) shared_bytes: u32,
    pub(crate) code: Vec<Inst>,
}

/// A parsed module.
#[derive(Clone, Debug)]
pub struct Module {
    pub(crate) kernels: HashMap<String, Kernel>,
    /// The `.target` it was written for (`sm_80`, ...).
    pub target: String,
}

impl Module {
    /// Reads a module written by aim's PTX emitter.
    pub fn parse(text: &str) -> Result<Module, ParseError> {
        let mut kernels = HashMap::new();
        let mut target = String::new();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let l = strip(lines[i]);
            if l.is_empty() {
                i += 1;
                continue;
            }
            if let Some(t) = l.strip_prefix(".target ") {
                target = t.trim().to_string();
            } else if let Some(rest) = l.strip_prefix(".visible .entry ") {
                let name = rest.trim_end_matches('(').trim().to_string();
                let (k, next) = kernel(&lines, i + 1)?;
                kernels.insert(name, k);
                i = next;
                continue;
            } else if !(l.starts_with(".version") || l.starts_with(".address_size")) {
                return Err(ParseError { line: i + 1, msg: format!("unexpected '{l}'") });
            }
            i += 1;
        }
        Ok(Module { kernels, target })
    }

    /// The kernels' names.
    pub fn kernel_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.kernels.keys().map(|s| s.as_str()).collect();
        v.sort_unstable();
        v
    }
}

fn strip(l: &str) -> &str {
    l.split("//").next().unwrap_or("").trim()
}

fn err(line: usize, msg: impl Into<String>) -> ParseError {
    ParseError { line: line + 1, msg: msg.into() }
}

/// Names in scope while reading one kernel.
struct Scope {
    regs: HashMap<String, (u32, u32)>,
    nregs: u32,
    shared: HashMap<String, u32>,
    shared_bytes: u32,
    params: HashMap<String, u32>,
}

impl Scope {
    fn reg(&self, name: &str) -> Option<u32> {
        let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
        let prefix = &name[..name.len() - digits.len()];
        let n: u32 = digits.parse().ok()?;
        let &(base, count) = self.regs.get(prefix)?;
        (n < count).then_some(base + n)
    }
}

/// Reads a kernel from the line after `.entry NAME(`; returns it and the line after its `}`.
fn kernel(lines: &[&str], mut i: usize) -> Result<(Kernel, usize), ParseError> {
    let mut scope =
        Scope { regs: HashMap::new(), nregs: 0, shared: HashMap::new(), shared_bytes: 0, params: HashMap::new() };
    let mut params = Vec::new();
    while i < lines.len() {
        let l = strip(lines[i]);
        i += 1;
        if l == ")" {
            break;
        }
        let mut parts = l.trim_end_matches(',').split_whitespace();
        let (Some(".param"), Some(ty), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(err(i - 1, format!("bad parameter '{l}'")));
        };
        let ty = Ty::parse(ty.trim_start_matches('.')).ok_or_else(|| err(i - 1, format!("parameter type {ty}")))?;
        scope.params.insert(name.to_string(), params.len() as u32);
        params.push(ty);
    }
    if strip(lines.get(i).copied().unwrap_or("")) != "{" {
        return Err(err(i, "expected '{'"));
    }
    i += 1;
    // Declarations, then code (labels resolved at the end).
    let mut raw: Vec<(usize, &str)> = Vec::new();
    let mut labels: HashMap<String, usize> = HashMap::new();
    loop {
        let Some(line) = lines.get(i) else { return Err(err(i, "kernel without '}'")) };
        let l = strip(line);
        i += 1;
        if l.is_empty() {
            continue;
        }
        if l == "}" {
            break;
        }
        if let Some(d) = l.strip_prefix(".reg ") {
            // .reg .f32 %f<12>;
            let d = d.trim_end_matches(';');
            let name = d.split_whitespace().nth(1).ok_or_else(|| err(i - 1, "bad .reg"))?;
            let (prefix, count) = name.trim_end_matches('>').split_once('<').ok_or_else(|| err(i - 1, "bad .reg"))?;
            let count: u32 = count.parse().map_err(|_| err(i - 1, "bad .reg count"))?;
            scope.regs.insert(prefix.trim_start_matches('%').to_string(), (scope.nregs, count));
            scope.nregs += count;
        } else if let Some(d) = l.strip_prefix(".shared ") {
            // .shared .align 16 .b8 name[bytes];
            let d = d.trim_end_matches(';');
            let decl = d.split_whitespace().last().ok_or_else(|| err(i - 1, "bad .shared"))?;
            let (name, bytes) = decl.trim_end_matches(']').split_once('[').ok_or_else(|| err(i - 1, "bad .shared"))?;
            let bytes: u32 = bytes.parse().map_err(|_| err(i - 1, "bad .shared size"))?;
            scope.shared.insert(name.to_string(), scope.shared_bytes);
            scope.shared_bytes += bytes.next_multiple_of(16);
        } else if let Some(label) = l.strip_suffix(':') {
            labels.insert(label.to_string(), raw.len());
        } else {
            raw.push((i - 1, l));
        }
    }
    let code = raw.iter().map(|&(line, l)| inst(l, line, &scope, &labels)).collect::<Result<Vec<_>, _>>()?;
    Ok((Kernel { params, regs: scope.nregs, shared_bytes: scope.shared_bytes, code }, i))
}

/// Splits operands at top-level commas.
fn split_operands(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in s.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn inst(l: &str, line: usize, scope: &Scope, labels: &HashMap<String, usize>) -> Result<Inst, ParseError> {
    let l = l.strip_suffix(';').ok_or_else(|| err(line, format!("missing ';' in '{l}'")))?.trim();
    let (guard, l) = match l.strip_prefix('@') {
        Some(rest) => {
            let (g, rest) = rest.split_once(char::is_whitespace).ok_or_else(|| err(line, "bad guard"))?;
            let (neg, g) = match g.strip_prefix('!') {
                Some(g) => (true, g),
                None => (false, g),
            };
            let r = g.strip_prefix('%').and_then(|g| scope.reg(g)).ok_or_else(|| err(line, format!("guard {g}")))?;
            (Some((r, neg)), rest.trim())
        }
        None => (None, l),
    };
    let (opcode, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
    let op = decode(opcode).ok_or_else(|| err(line, format!("unsupported instruction '{opcode}'")))?;
    let args = split_operands(rest)
        .iter()
        .map(|a| operand(a, scope, labels).ok_or_else(|| err(line, format!("bad operand '{a}' of {opcode}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let want = match op {
        Op::Bra => 1,
        Op::Ret | Op::CpCommit => 0,
        Op::BarSync | Op::CpWait => 1,
        Op::Mov(_) | Op::LdParam(_) | Op::Cvta | Op::Ld { .. } | Op::St { .. } | Op::Neg(_) | Op::Abs(_) => 2,
        Op::Sqrt | Op::Lg2 | Op::Rcp | Op::Not(_) | Op::Cvt { .. } => 2,
        Op::Mad(_) | Op::Fma | Op::Selp(_) => 4,
        Op::Shfl(_) => 5,
        Op::MmaTf32 | Op::MmaHalf(_) => 4,
        Op::CpAsync => args.len().clamp(3, 4),
        _ => 3,
    };
    if args.len() != want {
        return Err(err(line, format!("{opcode} takes {want} operands, got {}", args.len())));
    }
    Ok(Inst { guard, op, args, line: line + 1 })
}

fn decode(opcode: &str) -> Option<Op> {
    let p: Vec<&str> = opcode.split('.').collect();
    let last = |k: usize| Ty::parse(p[p.len() - k]);
    let ty = || last(1);
    let width = |p: &[&str]| -> u8 {
        if p.contains(&"v4") {
            4
        } else if p.contains(&"v2") {
            2
        } else {
            1
        }
    };
    Some(match p[0] {
        "mov" => Op::Mov(ty()?),
        "ld" if p.get(1) == Some(&"param") => Op::LdParam(ty()?),
        "ld" | "st" => {
            let space = match *p.get(1)? {
                "global" => Space::Global,
                "shared" => Space::Shared,
                _ => return None,
            };
            let (ty, width) = (ty()?, width(&p));
            if p[0] == "ld" {
                Op::Ld { space, ty, width }
            } else {
                Op::St { space, ty, width }
            }
        }
        "cvta" if opcode == "cvta.to.global.u64" => Op::Cvta,
        "add" => Op::Add(ty()?),
        "sub" => Op::Sub(ty()?),
        "mul" if p.get(1) == Some(&"wide") => Op::MulWide(ty()?),
        "mul" if p.get(1) == Some(&"lo") => Op::MulLo(ty()?),
        "mul" if ty()? == Ty::F32 => Op::MulLo(Ty::F32),
        "mad" if p.get(1) == Some(&"lo") => Op::Mad(ty()?),
        "fma" if ty()? == Ty::F32 => Op::Fma,
        "div" => Op::Div(ty()?),
        "rem" => Op::Rem(ty()?),
        "min" => Op::Min(ty()?, p.contains(&"NaN")),
        "max" => Op::Max(ty()?, p.contains(&"NaN")),
        "neg" => Op::Neg(ty()?),
        "abs" => Op::Abs(ty()?),
        "sqrt" if ty()? == Ty::F32 => Op::Sqrt,
        "rcp" if ty()? == Ty::F32 => Op::Rcp,
        "lg2" if opcode == "lg2.approx.f32" => Op::Lg2,
        "shl" => Op::Shl(ty()?),
        "shr" => Op::Shr(ty()?),
        "and" => Op::And(ty()?),
        "or" => Op::Or(ty()?),
        "xor" => Op::Xor(ty()?),
        "not" => Op::Not(ty()?),
        "cvt" if opcode == "cvt.rn.f16x2.f32" => Op::CvtPack(false),
        "cvt" if opcode == "cvt.rn.bf16x2.f32" => Op::CvtPack(true),
        "cvt" => {
            let round = match *p.get(1)? {
                "rn" => Round::Rn,
                "rna" => Round::Rna,
                "rni" => Round::Rni,
                "rzi" => Round::Rzi,
                "rmi" => Round::Rmi,
                _ => Round::None,
            };
            Op::Cvt { dst: last(2)?, src: last(1)?, round }
        }
        "setp" => {
            let cmp = match *p.get(1)? {
                "eq" => Cmp::Eq,
                "ne" => Cmp::Ne,
                "neu" => Cmp::Neu,
                "lt" | "lo" => Cmp::Lt,
                "le" | "ls" => Cmp::Le,
                "gt" | "hi" => Cmp::Gt,
                "ge" | "hs" => Cmp::Ge,
                _ => return None,
            };
            Op::Setp(cmp, ty()?)
        }
        "selp" => Op::Selp(ty()?),
        "bra" => Op::Bra,
        "ret" | "exit" => Op::Ret,
        "bar" if opcode == "bar.sync" => Op::BarSync,
        "shfl" if p.get(1) == Some(&"sync") && p.last() == Some(&"b32") => Op::Shfl(match *p.get(2)? {
            "bfly" => Shfl::Bfly,
            "idx" => Shfl::Idx,
            "down" => Shfl::Down,
            "up" => Shfl::Up,
            _ => return None,
        }),
        "mma" if opcode == "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" => Op::MmaTf32,
        "mma" if opcode == "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" => Op::MmaHalf(false),
        "mma" if opcode == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" => Op::MmaHalf(true),

        "cp" if opcode == "cp.async.ca.shared.global" || opcode == "cp.async.cg.shared.global" => Op::CpAsync,
        "cp" if opcode == "cp.async.commit_group" => Op::CpCommit,
        "cp" if opcode == "cp.async.wait_group" => Op::CpWait,
        _ => return None,
    })
}

fn special(s: &str) -> Option<Special> {
    let (name, dim) = s.split_once('.').unwrap_or((s, ""));
    let d = match dim {
        "x" => 0,
        "y" => 1,
        "z" => 2,
        "" if name == "laneid" => return Some(Special::LaneId),
        _ => return None,
    };
    Some(match name {
        "tid" => Special::Tid(d),
        "ntid" => Special::Ntid(d),
        "ctaid" => Special::Ctaid(d),
        "nctaid" => Special::Nctaid(d),
        _ => return None,
    })
}

fn immediate(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0f").or_else(|| s.strip_prefix("0F")) {
        return u32::from_str_radix(h, 16).ok().map(u64::from);
    }
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    s.parse::<i64>().ok().map(|v| v as u64)
}

fn operand(s: &str, scope: &Scope, labels: &HashMap<String, usize>) -> Option<Operand> {
    if let Some(inner) = s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
        let regs = inner.split(',').map(|r| r.trim().strip_prefix('%').and_then(|r| scope.reg(r)));
        return regs.collect::<Option<Vec<u32>>>().map(Operand::Vec);
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
        let inner = inner.replace(' ', "");
        let (base, off) = match inner.find(['+', '-']) {
            Some(k) if k > 0 => (&inner[..k], inner[k..].trim_start_matches('+').parse::<i64>().ok()?),
            _ => (inner.as_str(), 0),
        };
        let base = if let Some(r) = base.strip_prefix('%') {
            Base::Reg(scope.reg(r)?)
        } else if let Some(&o) = scope.shared.get(base) {
            Base::Shared(o)
        } else {
            Base::Param(*scope.params.get(base)?)
        };
        return Some(Operand::Addr(base, off));
    }
    if let Some(r) = s.strip_prefix('%') {
        return match special(r) {
            Some(sp) => Some(Operand::Special(sp)),
            None => scope.reg(r).map(Operand::Reg),
        };
    }
    if let Some(v) = immediate(s) {
        return Some(Operand::Imm(v));
    }
    if let Some(&o) = scope.shared.get(s) {
        return Some(Operand::Shared(o));
    }
    labels.get(s).map(|&pc| Operand::Label(pc))
}
