//! How the elementwise ops lower: each one elementwise program, one kernel.

use super::*;

impl Lowering<'_> {
    /// `aim:Elementwise`: its program compiled into one kernel over the output.
    pub(super) fn program(&mut self, n: &Node) -> Result<(), String> {
        let lines = n.strings("program").ok_or("no program")?;
        let prog = ewprog::parse(lines)?;
        let xs = (0..n.inputs.len()).map(|k| self.input(n, k)).collect::<Result<Vec<_>, _>>()?;
        let y = self.output(n, 0)?;
        for &x in &xs {
            self.f32_value(x)?;
            if self.shape(x) != self.shape(y) {
                return Err("inputs of another shape than the output".into());
            }
        }
        let count: usize = self.shape(y).iter().product();
        let k = elementwise::kernel("ew", &prog, xs.len());
        let mut args = vec![Arg::Value(y)];
        args.extend(xs.iter().map(|&x| Arg::Value(x)));
        args.push(Arg::U64(count as u64));
        let grid = grid_for(count, elementwise::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], elementwise::BLOCK, args);

        Ok(())
    }

    /// Clip: constant bounds, as one elementwise program.
    pub(super) fn clip(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        let bounds = [self.opt_input(n, 1)?, self.opt_input(n, 2)?];
        let y = self.output(n, 0)?;
        let out = self.shape(y);
        let mut xs = vec![x];
        let mut prog = vec![Inst::Input(0)];
        for (b, op) in bounds.into_iter().zip([Binary::Max, Binary::Min]) {
            let Some(b) = b else { continue };
            if self.values[b].bytes() != 4 {
                return Err("Clip's bounds must be scalars".into());
            }
            xs.push(b);
            prog.push(Inst::Input(xs.len() - 1));
            let last = prog.len();
            prog.push(Inst::Binary(op, Operand::Ref(last - 2), Operand::Ref(last - 1)));
        }
        let mut strides = Vec::new();
        for &v in &xs {
            self.f32_value(v)?;
            strides.push(strided::broadcast_strides(&self.shape(v), &out).ok_or("shapes do not broadcast")?);
        }
        self.strided(n, y, &xs, strides, &prog);

        Ok(())
    }

    /// The unary math ops, as one elementwise program each.
    pub(super) fn unary(&mut self, n: &Node) -> Result<(), String> {
        let x = self.input(n, 0)?;
        self.f32_value(x)?;
        let y = self.output(n, 0)?;
        let u = match n.op.as_str() {
            "Relu" => Unary::Relu,
            "Sigmoid" => Unary::Sigmoid,
            "Tanh" => Unary::Tanh,
            "Exp" => Unary::Exp,
            "Erf" => Unary::Erf,
            "Sqrt" => Unary::Sqrt,
            "Neg" => Unary::Neg,
            "Abs" => Unary::Abs,
            _ => Unary::Reciprocal,
        };
        let strides = strided::broadcast_strides(&self.shape(x), &self.shape(y)).ok_or("shape mismatch")?;
        self.strided(n, y, &[x], vec![strides], &[Inst::Input(0), Inst::Unary(u, Operand::Ref(0))]);

        Ok(())
    }

    /// The parameterised activations (LeakyRelu, HardSigmoid, HardSwish, Gelu, Elu), as one
    /// elementwise program each.
    pub(super) fn activation(&mut self, n: &Node) -> Result<(), String> {
        let act = aim_compiler::passes::fuse::node_activation(self.g, n).ok_or("unknown activation")?;
        let x = self.input(n, 0)?;
        self.f32_value(x)?;
        let y = self.output(n, 0)?;
        let strides = strided::broadcast_strides(&self.shape(x), &self.shape(y)).ok_or("shape mismatch")?;
        self.strided(n, y, &[x], vec![strides], &gemm::activation_program(act));

        Ok(())
    }

    /// Add, Sub, Mul, Div (two inputs) and Max, Min, Sum, Mean (any number), f32 with numpy
    /// broadcasting, folded left to right as the reference kernels do.
    pub(super) fn variadic(&mut self, n: &Node) -> Result<(), String> {
        let xs = (0..n.inputs.len()).map(|k| self.input(n, k)).collect::<Result<Vec<_>, _>>()?;
        let binary = matches!(n.op.as_str(), "Add" | "Sub" | "Mul" | "Div");
        if xs.is_empty() || (binary && xs.len() != 2) {
            return Err(format!("{} inputs", xs.len()));
        }
        let y = self.output(n, 0)?;
        let out = self.shape(y);
        let mut strides = Vec::new();
        for &x in &xs {
            self.f32_value(x)?;
            strides.push(strided::broadcast_strides(&self.shape(x), &out).ok_or("shapes do not broadcast")?);
        }
        let bin = match n.op.as_str() {
            "Add" | "Sum" | "Mean" => Binary::Add,
            "Sub" => Binary::Sub,
            "Mul" => Binary::Mul,
            "Div" => Binary::Div,
            "Max" => Binary::Max,
            _ => Binary::Min,
        };
        let mut prog: Vec<Inst> = (0..xs.len()).map(Inst::Input).collect();
        let mut acc = 0;
        for j in 1..xs.len() {
            prog.push(Inst::Binary(bin, Operand::Ref(acc), Operand::Ref(j)));
            acc = prog.len() - 1;
        }
        if n.op == "Mean" && xs.len() > 1 {
            prog.push(Inst::Binary(Binary::Div, Operand::Ref(acc), Operand::Const(xs.len() as f32)));
        }
        self.strided(n, y, &xs, strides, &prog);
        Ok(())
    }

    /// Equal, Less, Greater, LessOrEqual, GreaterOrEqual: bool bytes, operands broadcast.
    pub(super) fn compare(&mut self, n: &Node) -> Result<(), String> {
        let (a, b) = (self.input(n, 0)?, self.input(n, 1)?);
        let ty = match (self.values[a].dtype, self.values[b].dtype) {
            (DType::F32, DType::F32) => strided::Operands::F32,
            (DType::I64, DType::I64) => strided::Operands::I64,
            (DType::I32, DType::I32) => strided::Operands::I32,
            (DType::Bool, DType::Bool) if n.op == "Equal" => strided::Operands::Bool,
            (x, z) => return Err(format!("comparing {x} with {z} is not supported on the GPU yet")),
        };
        let y = self.output(n, 0)?;
        let out = self.shape(y);
        let st = |l: &Self, v: usize| strided::broadcast_strides(&l.shape(v), &out).ok_or("shapes do not broadcast");
        let strides = [st(self, a)?, st(self, b)?];
        let cmp = match n.op.as_str() {
            "Equal" => "eq",
            "Less" => "lt",
            "Greater" => "gt",
            "LessOrEqual" => "le",
            _ => "ge",
        };
        let count: usize = out.iter().product();
        let k = strided::compare("compare", &out, &strides, cmp, ty);
        let args = vec![Arg::Value(y), Arg::Value(a), Arg::Value(b), Arg::U64(count as u64)];
        let grid = grid_for(count, strided::BLOCK, &self.target);
        self.launch(n, k, [grid, 1, 1], strided::BLOCK, args);
        Ok(())
    }
}
