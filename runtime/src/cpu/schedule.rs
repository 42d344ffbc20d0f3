//! What the program does for each node, as text (`aim explore --stage scheduled`): the
//! kernel, its loop nest with tile and block sizes, and the parallel tasks — computed from
//! the prepared nodes and the constants their loops use, for the shapes the graph's types
//! give (nodes whose shapes are only known at run time say so).

use super::{blocked, elementwise, softmax, transpose, CpuProgram, NodeKind, Prepared};
use aim_ir::Graph;
use aim_kernels::gemm::IsaKind;

fn shape_of(g: &Graph, name: &str) -> Option<Vec<usize>> {
    g.value_type(name)?.concrete_shape()
}

impl CpuProgram {
    /// One entry per node of [`CpuProgram::graph`]: the lines describing how it runs.
    pub fn schedule(&self) -> Vec<Vec<String>> {
        let g = &self.graph;
        let kinds = self.node_kinds();
        g.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let out = n.outputs.first().and_then(|o| shape_of(g, o));
                let input = n.inputs.first().and_then(|x| shape_of(g, x));
                let dynamic = || vec!["shapes known only at run time: loop bounds are bound then".to_string()];
                match self.prepared.get(&i) {
                    Some(Prepared::Blocked(c)) => match (&input, out) {
                        (Some(x), Some(s)) if x.len() >= 4 && s.len() == 5 => {
                            blocked::schedule(c, x, &s, n.input(3).is_some())
                        }
                        _ => dynamic(),
                    },
                    Some(Prepared::Reorder(r)) => match input {
                        Some(s) if s.len() >= 4 => blocked::reorder_schedule(r, &s),
                        _ => dynamic(),
                    },
                    Some(Prepared::Pool(p)) => match input {
                        Some(s) if s.len() == 5 => blocked::pool_schedule(p, &s),
                        _ => dynamic(),
                    },
                    Some(Prepared::Conv(c)) => with_post(c.post.as_deref(), match out {
                        Some(s) if s.len() >= 3 && c.by_position.is_some() => {
                            let k = c.by_position.as_ref().map_or(0, |(w, _)| w.k);
                            let rows = s[0] * s[2..].iter().product::<usize>();
                            vec![format!(
                                "C[{rows} positions × {} ch] = windows[{rows}×{k}] · W (positions as GEMM rows: every window gathered, then C scattered to NCHW)",
                                c.m
                            )]
                        }
                        Some(s) if s.len() >= 3 && !c.weights.is_empty() => {
                            let (mg, k) = (c.m / c.group, c.weights[0].k);
                            let n_out: usize = s[2..].iter().product();
                            let gather = if s.len() == 4 { "padded stride phases" } else { "strips gathered per tile" };
                            let mut v = vec![format!(
                                "for image in 0..{}, group in 0..{}: C[{mg} ch × {n_out} px] = W[{mg}×{k}] · im2col ({gather}, never materialised)",
                                s[0], c.group
                            )];
                            v.extend(aim_kernels::gemm::schedule(self.isa, self.blocking, mg, n_out, k, None, self.pool.size()).into_iter().map(|l| format!("  {l}")));
                            v
                        }
                        _ => dynamic(),
                    }),
                    Some(Prepared::Deconv(_)) => vec![
                        "for image, group: cols[Cout·kh·kw × H·W] = Wᵀ · X (packed GEMM, X read in place); parallel for output channel: overlap-add the kh×kw taps into the output, + bias, + residual, activation".to_string(),
                    ],
                    Some(Prepared::Depthwise(d)) => with_post(d.post.as_deref(), vec!["direct depthwise convolution over NCHW planes: parallel for plane; 3×3 as one 9-tap filter over padded stride phases".to_string()]),
                    Some(Prepared::Dense(d)) => match input {
                        Some(s) if !s.is_empty() => {
                            let m: usize = s[..s.len() - 1].iter().product();
                            let a = if m > 4 && !matches!(self.isa.kind(), IsaKind::Avx512 | IsaKind::Avx2) { "packed per run" } else { "rows read in place" };
                            let mut v = vec![format!("C[{m}×{}] = A[{m}×{}] · W (W {}, A {a})", d.n, d.k, d.weight.held())];
                            v.extend(aim_kernels::gemm::schedule(self.isa, self.blocking, m, d.n, d.k, Some(&d.weight), self.pool.size()).into_iter().map(|l| format!("  {l}")));
                            if let Some(p) = &d.post {
                                v.push(format!("  each tile, after its activation: the program after the layer ({} steps, over the tile gathered into one block)", p.steps()));
                            }
                            v
                        }
                        _ => dynamic(),
                    },
                    Some(Prepared::QDense(d)) => match input {
                        Some(s) if !s.is_empty() => {
                            super::qdense::schedule(d, self.isa, s[..s.len() - 1].iter().product(), self.pool.size())
                        }
                        _ => dynamic(),
                    },
                    Some(Prepared::QConv(q)) => match input {
                        Some(s) if s.len() == 4 => super::qconv::schedule(q, self.isa, s[0], s[2], s[3]),
                        _ => dynamic(),
                    },
                    Some(Prepared::Reduce(r)) => match input {
                        Some(s) if s.len() > r.axis => {
                            let (rows, len): (usize, usize) = (s[..r.axis].iter().product(), s[r.axis..].iter().product());
                            vec![format!(
                                "parallel for row chunk in 0..{} of ≤{} rows: generated loop (Cranelift), {rows} rows of {len}: 4 f32x4 accumulators, horizontal combine, scalar tail",
                                rows.div_ceil((elementwise::CHUNK / len.max(1)).max(1)),
                                (elementwise::CHUNK / len.max(1)).max(1)
                            )]
                        }
                        _ => dynamic(),
                    },
                    Some(Prepared::Transpose(t)) => match out {
                        Some(s) if s.len() == t.perm.len() => {
                            let inner = s[s.len() - 1];
                            let rows: usize = s[..s.len() - 1].iter().product();
                            let per = transpose::rows_per_task(inner);
                            let how = if t.perm.last() == Some(&(t.perm.len() - 1)) { "f32x4 copies of contiguous runs" } else { "gathers at the source stride, 4 per step" };
                            vec![format!("parallel for row chunk in 0..{} of ≤{per} rows: generated loop (Cranelift), perm {:?}, {rows} rows of {inner}: {how}, scalar tail", rows.div_ceil(per), t.perm)]
                        }
                        _ => dynamic(),
                    },
                    Some(Prepared::Int8(p)) => super::int8::schedule(p, self.isa, input.as_deref(), out.as_deref()),
                    Some(Prepared::Softmax(scale)) => match out {
                        Some(s) if !s.is_empty() => softmax::schedule(*scale, &s, n.input(1).is_some()),
                        _ => dynamic(),
                    },
                    Some(Prepared::Elementwise(_)) => match out {
                        Some(s) => {
                            let len: usize = s.iter().product();
                            let shapes: Option<Vec<Vec<usize>>> = n.inputs.iter().map(|x| shape_of(g, x)).collect();
                            let views: Vec<&[usize]> = shapes.iter().flatten().map(|v| v.as_slice()).collect();
                            if let Some(rows) = elementwise::Rows::new(&views, &s).ok().filter(|r| !r.flat()) {
                                return vec![format!(
                                    "inputs broadcast: {}; parallel for tasks of ≤{} elements (whole rows, or parts of a longer row): the loop per row, each input at its row (a one-value input filled into a row first)",
                                    rows.describe(),
                                    elementwise::CHUNK
                                )];
                            }
                            vec![format!(
                                "parallel for chunk in 0..{} of ≤{} elements: generated loop (Cranelift), f32x4 body + scalar tail, over {len} elements",
                                len.div_ceil(elementwise::CHUNK).max(1),
                                elementwise::CHUNK
                            )]
                        }
                        None => dynamic(),
                    },
                    None => vec![match kinds[i] {
                        NodeKind::View => "a view of its input: no kernel runs (the input's arena slot, read with the output's shape)".to_string(),
                        NodeKind::Metadata => format!("{}: a new shape over the same bytes, or a read of the input's shape (no data moved)", n.op),
                        NodeKind::CompiledControlFlow => format!("{}: its bodies run as compiled programs of their own", n.op),
                        NodeKind::Fast if n.domain == "aim" && n.op == "Attention" => format!(
                            "attention kernel: per key/value item, the query rows of every batch item reading it: softmax(scores·{} {}), then Σ p·V rows; fewer than 8 rows per item: 4 at a time against each key row where it lies, else per group of GEMM tile rows against the keys and values packed once into microkernel panels{}",
                            n.float("scale", 1.0),
                            if n.input(3).is_some() { "+ mask row" } else { "" },
                            ["q_perm", "k_perm", "v_perm", "out_perm"]
                                .iter()
                                .filter_map(|a| n.ints(a).map(|p| format!("; {a} {p:?} read in place")))
                                .collect::<String>()
                        ),
                        NodeKind::Fast if n.domain == "aim" && n.op == "QMatMul" => format!(
                            "integer product of two quantized activations: A quantized to u8 (scale {} zero {}), each B item quantized (scale {} zero {}) and packed per run, exact sums × {} in the epilogue",
                            n.float("a_scale", 0.0),
                            n.int("a_zero", 0),
                            n.float("b_scale", 0.0),
                            n.int("b_zero", 0),
                            n.float("a_scale", 0.0) * n.float("b_scale", 0.0)
                        ),
                        NodeKind::Fast if aim_kernels::fast::covers(&n.op, Some(aim_ir::DType::I64)) => {
                            format!("fast kernel for {} (rows of the output, parallel when large; integer and other dtypes too)", n.op)
                        }
                        NodeKind::Fast => format!("fast f32 kernel for {} (vectorised, parallel over rows; the reference kernel for other dtypes)", n.op),
                        _ => format!("reference kernel for {} (interpreted)", n.op),
                    }],
                }
            })
            .collect()
    }
}

/// An NCHW convolution's loops, then the pass of the program after it (`post`), if any.
fn with_post(post: Option<&aim_kernels::ewprog::wide::Wide>, mut v: Vec<String>) -> Vec<String> {
    if let Some(p) = post {
        v.push(format!("then the program after the layer over the output ({} steps, parallel chunks)", p.steps()));
    }
    v
}
