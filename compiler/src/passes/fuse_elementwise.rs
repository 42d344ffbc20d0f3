//! Elementwise fusion: a chain of f32 elementwise ops over tensors of one shape (scalar
//! constants allowed) becomes one `aim:Elementwise` node whose `program` the code generator
//! turns into a single loop — one pass over memory instead of one per op (GELU's five ops,
//! for example). Where the shape has dims unknown at compile time (a dynamic image width
//! through a convolution), a chain that reads a single value is fused: SiLU's Sigmoid and Mul
//! of one tensor, a scale and an activation.

use super::{fuse::sources_of, uses::readers, PassError, SOURCES};
use crate::ewprog::{Binary, Inst, Operand, Unary};
use aim_ir::{Attr, DType, Dim, Graph, Node};
use aim_kernels::ewprog::Rows;

/// The shortest row of a loop whose inputs broadcast: shorter rows would spend more in the
/// per-row call than the loop saves over separate kernels.
const MIN_ROW: usize = 64;

fn unary(op: &str, round: bool) -> Option<Unary> {
    Some(match op {
        "Round" if round => Unary::Round,
        "Neg" => Unary::Neg,
        "Abs" => Unary::Abs,
        "Sqrt" => Unary::Sqrt,
        "Relu" => Unary::Relu,
        "Exp" => Unary::Exp,
        "Erf" => Unary::Erf,
        "Tanh" => Unary::Tanh,
        "Sigmoid" => Unary::Sigmoid,
        "Reciprocal" => Unary::Reciprocal,
        _ => return None,
    })
}

fn binary(op: &str) -> Option<Binary> {
    Some(match op {
        "Add" => Binary::Add,
        "Sub" => Binary::Sub,
        "Mul" => Binary::Mul,
        "Div" => Binary::Div,
        "Max" => Binary::Max,
        "Min" => Binary::Min,
        _ => return None,
    })
}

/// Builds a fused program from a chain of nodes.
struct Builder<'g> {
    g: &'g Graph,
    /// Whether Round may (the target rounds vectors: SSE4.1 or NEON).
    round: bool,
    /// Whether inputs may broadcast to the group's shape (the cpu runtime runs such loops
    /// row by row).
    broadcast: bool,
    /// The common shape (symbolic dims allowed: equal names are equal sizes).
    shape: Vec<Dim>,
    insts: Vec<Inst>,
    inputs: Vec<String>,
    /// Value name → instruction computing it.
    defined: Vec<(String, usize)>,
}

impl Builder<'_> {
    /// The operand for value `v`: a constant scalar, a group value, or a new input.
    fn operand(&mut self, v: &str) -> Option<Operand> {
        if let Some((_, i)) = self.defined.iter().find(|(n, _)| n == v) {
            return Some(Operand::Ref(*i));
        }
        if let Some(t) = self.g.initializers.get(v) {
            if t.dtype() == DType::F32 && t.len() == 1 && t.rank() <= self.shape.len() {
                return Some(Operand::Const(t.data::<f32>()[0]));
            }
            // A constant of more values (a bias per feature, a scale per channel) is an
            // input that broadcasts, read in place from the initializer.
            if !(self.broadcast && t.dtype() == DType::F32) {
                return None;
            }
        }
        let ty = self.g.value_type(v)?;
        let shape = ty.shape?;
        if ty.dtype != Some(DType::F32) || (shape != self.shape && !self.broadcasts(&shape)) {
            return None;
        }
        // Dims unknown at compile time cannot show two values to have one shape: such a
        // group reads one value (and scalar constants), so that every value in it has that
        // value's shape whatever it is at run time.
        if self.shape.contains(&Dim::Unknown) && !self.inputs.is_empty() {
            return None;
        }
        let k = self.inputs.len();
        self.inputs.push(v.to_string());
        self.insts.push(Inst::Input(k));
        let i = self.insts.len() - 1;
        self.defined.push((v.to_string(), i));
        Some(Operand::Ref(i))
    }

    /// Appends node `n`'s instruction, or returns false (and leaves the program as it was).
    fn push(&mut self, n: &Node) -> bool {
        let saved = (self.insts.len(), self.inputs.len(), self.defined.len());
        let ok = self.try_push(n);
        if !ok {
            self.insts.truncate(saved.0);
            self.inputs.truncate(saved.1);
            self.defined.truncate(saved.2);
        }
        ok
    }

    fn try_push(&mut self, n: &Node) -> bool {
        if n.domain == "aim" && n.op == "Elementwise" && n.outputs.len() == 1 {
            return self.inline(n);
        }
        if !n.domain.is_empty() || n.outputs.len() != 1 {
            return false;
        }
        let out_ok = self
            .g
            .value_type(&n.outputs[0])
            .is_some_and(|t| t.dtype == Some(DType::F32) && t.shape.as_deref() == Some(&self.shape[..]));
        if !out_ok {
            return false;
        }
        let inst = if let Some(u) = unary(&n.op, self.round) {
            match n.input(0).and_then(|v| self.operand(v)) {
                Some(a) if n.inputs.len() == 1 => Inst::Unary(u, a),
                _ => return false,
            }
        } else if let Some(b) = binary(&n.op) {
            if n.inputs.len() != 2 {
                return false;
            }
            match (self.operand(&n.inputs[0]), self.operand(&n.inputs[1])) {
                (Some(x), Some(y)) => Inst::Binary(b, x, y),
                _ => return false,
            }
        } else if n.op == "LeakyRelu" {
            match n.input(0).and_then(|v| self.operand(v)) {
                Some(a) => Inst::LeakyRelu(a, n.float_attr("alpha")),
                None => return false,
            }
        } else if let Some(last) = self.decomposed(n) {
            // Already pushed as several instructions; `last` computes the node's output.
            self.defined.push((n.outputs[0].clone(), last));
            return true;
        } else if n.op == "Clip" {
            let bound = |i: usize, d: f32| -> Option<f32> {
                match n.input(i) {
                    None => Some(d),
                    Some(v) => self
                        .g
                        .initializers
                        .get(v)
                        .filter(|t| t.dtype() == DType::F32 && t.len() == 1)
                        .map(|t| t.data::<f32>()[0]),
                }
            };
            match (bound(1, f32::NEG_INFINITY), bound(2, f32::INFINITY), n.input(0).and_then(|v| self.operand(v))) {
                (Some(lo), Some(hi), Some(a)) => Inst::Clip(a, lo, hi),
                _ => return false,
            }
        } else {
            return false;
        };
        self.insts.push(inst);
        self.defined.push((n.outputs[0].clone(), self.insts.len() - 1));
        true
    }
}

impl Builder<'_> {
    /// Appends the program of `n`, an `aim:Elementwise` an earlier fusion made (of a chain
    /// that did not broadcast), its inputs mapped to the group's values.
    fn inline(&mut self, n: &Node) -> bool {
        let out_ok = self.g.value_type(&n.outputs[0]).is_some_and(|t| t.shape.as_deref() == Some(&self.shape[..]));
        let Some(prog) = n.strings("program").and_then(|p| crate::ewprog::parse(p).ok()) else { return false };
        if !out_ok {
            return false;
        }
        let mut map: Vec<Operand> = Vec::with_capacity(prog.len());
        for inst in prog {
            let o = match inst {
                Inst::Input(k) => match n.inputs.get(k).and_then(|v| self.operand(v)) {
                    Some(o) => o,
                    None => return false,
                },
                other => {
                    let inst = other.map_operands(|o| match o {
                        Operand::Ref(i) => map[i],
                        c => c,
                    });
                    self.emit(inst)
                }
            };
            map.push(o);
        }
        match map.last() {
            Some(&Operand::Ref(i)) => {
                self.defined.push((n.outputs[0].clone(), i));
                true
            }
            _ => false,
        }
    }

    /// Whether an input of `shape` may join the group although it broadcasts to the group's
    /// shape: where the target allows it, all dims are known, and the output's rows
    /// ([`Rows`]) stay at least [`MIN_ROW`] long with it and the inputs so far — each row is
    /// one call of the loop.
    fn broadcasts(&self, shape: &[Dim]) -> bool {
        let known = |s: &[Dim]| s.iter().map(|d| d.known()).collect::<Option<Vec<usize>>>();
        let (Some(out), Some(new)) = (known(&self.shape), known(shape)) else { return false };
        if !self.broadcast {
            return false;
        }
        let mut shapes = Vec::new();
        for v in &self.inputs {
            match self.g.value_type(v).and_then(|t| t.shape).as_deref().and_then(known) {
                Some(s) => shapes.push(s),
                None => return false,
            }
        }
        shapes.push(new);
        let views: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
        Rows::new(&views, &out).is_ok_and(|r| r.len() >= MIN_ROW)
    }

    /// Appends `inst` and returns it as an operand.
    fn emit(&mut self, inst: Inst) -> Operand {
        self.insts.push(inst);
        Operand::Ref(self.insts.len() - 1)
    }

    /// Activations that are a few of the program's instructions: pushes them and returns the
    /// index of the last, or None (nothing pushed that `push` would not undo) for other ops.
    fn decomposed(&mut self, n: &Node) -> Option<usize> {
        use Binary::{Add, Mul, Sub};
        use Operand::Const;
        let known = matches!(
            n.op.as_str(),
            "HardSigmoid" | "HardSwish" | "Softsign" | "Swish" | "PRelu" | "Gelu" | "Elu" | "Selu" | "Celu"
        );
        if !known {
            return None;
        }
        let x = self.operand(n.input(0)?)?;
        let out = match n.op.as_str() {
            // clip(alpha·x + beta, 0, 1); HardSwish is x · HardSigmoid(x) with 1/6 and 1/2.
            "HardSigmoid" | "HardSwish" => {
                let (alpha, beta) =
                    if n.op == "HardSwish" { (1.0 / 6.0, 0.5) } else { (n.float_attr("alpha"), n.float_attr("beta")) };
                let ax = self.emit(Inst::Binary(Mul, x, Const(alpha)));
                let shifted = self.emit(Inst::Binary(Add, ax, Const(beta)));
                let gate = self.emit(Inst::Clip(shifted, 0.0, 1.0));
                if n.op == "HardSwish" {
                    self.emit(Inst::Binary(Mul, x, gate))
                } else {
                    gate
                }
            }
            // x / (1 + |x|)
            "Softsign" => {
                let a = self.emit(Inst::Unary(Unary::Abs, x));
                let d = self.emit(Inst::Binary(Add, a, Const(1.0)));
                self.emit(Inst::Binary(Binary::Div, x, d))
            }
            // x · sigmoid(alpha · x)
            "Swish" => {
                let alpha = n.float_attr("alpha");
                let ax = if alpha == 1.0 { x } else { self.emit(Inst::Binary(Mul, x, Const(alpha))) };
                let gate = self.emit(Inst::Unary(Unary::Sigmoid, ax));
                self.emit(Inst::Binary(Mul, x, gate))
            }
            // max(x, 0) + slope · min(x, 0), for a scalar constant slope.
            "PRelu" => {
                let slope = match self.operand(n.input(1)?)? {
                    c @ Const(_) => c,
                    Operand::Ref(_) => return None,
                };
                let pos = self.emit(Inst::Unary(Unary::Relu, x));
                let neg = self.emit(Inst::Binary(Binary::Min, x, Const(0.0)));
                let scaled = self.emit(Inst::Binary(Mul, neg, slope));
                self.emit(Inst::Binary(Add, pos, scaled))
            }
            // max(x, 0) + gamma·alpha·(exp(min(x, 0) / theta) − 1) with (alpha, gamma, theta) =
            // (alpha, 1, 1) for Elu, (alpha, gamma, 1) for Selu, (alpha, 1, alpha) for Celu;
            // Selu also scales the positive part by gamma.
            "Elu" | "Selu" | "Celu" => {
                let (alpha, gamma, theta) = match n.op.as_str() {
                    "Elu" => (n.float_attr("alpha"), 1.0, 1.0),
                    "Selu" => (n.float_attr("alpha"), n.float_attr("gamma"), 1.0),
                    _ => (n.float_attr("alpha"), 1.0, n.float_attr("alpha")),
                };
                let neg = self.emit(Inst::Binary(Binary::Min, x, Const(0.0)));
                let arg = self.emit(Inst::Binary(Binary::Div, neg, Const(theta)));
                let e = self.emit(Inst::Unary(Unary::Exp, arg));
                let em1 = self.emit(Inst::Binary(Sub, e, Const(1.0)));
                let negpart = self.emit(Inst::Binary(Mul, em1, Const(alpha * gamma)));
                let pos = self.emit(Inst::Unary(Unary::Relu, x));
                let pos = if gamma == 1.0 { pos } else { self.emit(Inst::Binary(Mul, pos, Const(gamma))) };
                self.emit(Inst::Binary(Add, pos, negpart))
            }
            // The exact form: 0.5·x·(1 + erf(x/√2)); the tanh approximation stays with the
            // GELU pass and the fast kernel.
            "Gelu" if n.string("approximate", "none") == "none" => {
                let scaled = self.emit(Inst::Binary(Mul, x, Const(std::f32::consts::FRAC_1_SQRT_2)));
                let e = self.emit(Inst::Unary(Unary::Erf, scaled));
                let e1 = self.emit(Inst::Binary(Add, e, Const(1.0)));
                let xe = self.emit(Inst::Binary(Mul, x, e1));
                self.emit(Inst::Binary(Mul, xe, Const(0.5)))
            }
            _ => return None,
        };
        match out {
            Operand::Ref(i) => Some(i),
            Operand::Const(_) => None,
        }
    }
}

/// Whether a group of this one node is worth a generated loop: the op has no fast kernel
/// (it would otherwise run on the reference kernel). Chains of two or more always fuse.
fn worth_alone(n: &Node) -> bool {
    n.domain.is_empty() && !aim_kernels::fast::covers(&n.op, Some(DType::F32))
}

/// Fuses chains of two or more elementwise nodes (Round only when `round`; inputs that
/// broadcast to the chain's shape only when `broadcast`).
///
/// One reader index serves the whole pass: a fused node takes its last member's place and the
/// other members become tombstones, removed at the end, so node indices stay valid and the
/// index needs only the fused node's inputs redirected. Linear in the graph size.
pub fn run(g: &mut Graph, round: bool, broadcast: bool) -> Result<(), PassError> {
    let mut r = readers(g);
    let mut removed = vec![false; g.nodes.len()];
    for i in 0..g.nodes.len() {
        if removed[i] {
            continue;
        }
        let start = &g.nodes[i];
        let Some(shape) = start.outputs.first().and_then(|o| g.value_type(o)).and_then(|t| t.shape) else {
            continue;
        };
        let mut b = Builder { g, round, broadcast, shape, insts: Vec::new(), inputs: Vec::new(), defined: Vec::new() };
        if !b.push(start) {
            continue;
        }
        let mut members = vec![i];
        let mut out = start.outputs[0].clone();
        // Extend while the current value has exactly one reader, later in the graph, that fits.
        while let Some(&[next]) = r.get(&out).map(|v| v.as_slice()) {
            let saved = (b.insts.len(), b.inputs.len(), b.defined.len());
            if next == usize::MAX || next <= *members.last().unwrap() || !b.push(&g.nodes[next]) {
                break;
            }
            // Every value the group computed so far must be read only inside the group.
            let inside = b.defined.iter().filter(|(n, _)| !b.inputs.contains(n)).all(|(n, _)| {
                r.get(n).is_some_and(|rs| rs.iter().all(|x| members.contains(x) || *x == next))
                    || *n == g.nodes[next].outputs[0]
            });
            if !inside {
                b.insts.truncate(saved.0);
                b.inputs.truncate(saved.1);
                b.defined.truncate(saved.2);
                break;
            }
            members.push(next);
            out = g.nodes[next].outputs[0].clone();
        }
        if members.len() < 2 && !worth_alone(&g.nodes[i]) {
            continue;
        }
        let (insts, inputs) = (b.insts, b.inputs);
        let mut sources = Vec::new();
        for &m in &members {
            sources.extend(sources_of(&g.nodes[m]));
        }
        let last = *members.last().unwrap();
        // The group's inputs are now read by the fused node (at `last`) instead of its members.
        for v in &inputs {
            if let Some(rs) = r.get_mut(v) {
                rs.retain(|x| !members.contains(x));
                rs.push(last);
                rs.sort_unstable();
            }
        }
        let fused = Node {
            name: g.nodes[members[0]].name.clone(),
            op: "Elementwise".into(),
            domain: "aim".into(),
            inputs,
            outputs: vec![out],
            attrs: [
                ("program".to_string(), Attr::Strings(insts.iter().map(|x| x.to_text()).collect())),
                (SOURCES.to_string(), Attr::Strings(sources)),
            ]
            .into_iter()
            .collect(),
        };
        g.nodes[last] = fused;
        for &k in &members[..members.len() - 1] {
            removed[k] = true;
        }
    }
    super::uses::remove_marked(g, &removed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use aim_ir::text::{parse_graph, print_graph, TensorDetail};

    /// With a dim unknown at compile time, a chain reading one value fuses (SiLU of a scaled
    /// value, which two nodes read, so the scale stays apart); an Add of two such values does
    /// not (they might broadcast at run time), and the chain after it fuses without it.
    #[test]
    fn unknown_dims_fuse_chains_of_one_value() {
        let mut g = parse_graph(concat!(
            "graph \"g\" {\n",
            " input %x: f32[1,?]\n",
            " input %y: f32[1,?]\n",
            " init %s = f32[] [0.5]\n",
            " %a: f32[1,?] = Mul(%x, %s)  # scale\n",
            " %b: f32[1,?] = Sigmoid(%a)  # sig\n",
            " %c: f32[1,?] = Mul(%a, %b)  # silu\n",
            " %d: f32[1,?] = Add(%c, %y)  # add\n",
            " %e: f32[1,?] = Tanh(%d)  # tanh\n",
            " %f: f32[1,?] = Mul(%e, %s)  # scale2\n",
            " output %f: f32[1,?]\n",
            "}\n"
        ))
        .unwrap();
        super::run(&mut g, true, true).unwrap();
        let text = print_graph(&g, TensorDetail::Full);
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(ops, ["Mul", "Elementwise", "Add", "Elementwise"], "{text}");
        assert_eq!(g.nodes[1].inputs, ["a"], "{text}");
        assert_eq!(g.nodes[3].inputs, ["d"], "{text}");
    }
}
