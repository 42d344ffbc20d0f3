//! Which blocked-convolution kernel runs a convolution: decided once, by the compiler's
//! `select-kernels` pass (which records it on the node for `aim explore` and `.aim` files),
//! from the same rule the runtime checks the recorded choice against.

/// The kernels a blocked (NCHWc) convolution can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedKernel {
    /// Winograd F(4×4, 3×3): 36 matrix products on transformed tiles.
    Winograd,
    /// The direct kernel (any kernel size, stride, dilation), one group.
    Direct,
    /// One filter per channel.
    Depthwise,
}

impl BlockedKernel {
    /// The name the `kernel` attribute holds.
    pub fn name(self) -> &'static str {
        match self {
            BlockedKernel::Winograd => "winograd",
            BlockedKernel::Direct => "direct",
            BlockedKernel::Depthwise => "depthwise",
        }
    }

    /// The kernel a `kernel` attribute names.
    pub fn parse(s: &str) -> Option<BlockedKernel> {
        [BlockedKernel::Winograd, BlockedKernel::Direct, BlockedKernel::Depthwise].into_iter().find(|k| k.name() == s)
    }
}

/// What the choice depends on: the convolution's shape as a blocked kernel sees it.
#[derive(Clone, Copy, Debug)]
pub struct ConvShape {
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Dilations.
    pub dilations: [usize; 2],
    /// Groups.
    pub group: usize,
    /// Whether the input is blocked (else NCHW, read directly).
    pub blocked_input: bool,
    /// Input channels per group.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// The channel block of the target.
    pub lanes: usize,
    /// Whether the operands are whole numbers whose sums must come out exact (a
    /// `ConvInteger` run in f32, node attribute [`EXACT_SUMS`]): not Winograd, whose
    /// transforms take fractions of them and round.
    pub exact: bool,
}

/// The node attribute (an int, 1) that marks a convolution whose operands are whole
/// numbers and whose sums must stay exact (see [`ConvShape::exact`]).
pub const EXACT_SUMS: &str = "exact_sums";

/// The largest transformed filter (36/9 of the 3×3 one) that Winograd may use, in bytes:
/// larger layers (ResNet-50's 512-channel ones, 7×7 images) gain little and would hold
/// 38 MB each.
const WINOGRAD_MAX_BYTES: usize = 16 << 20;

impl ConvShape {
    /// Whether `kernel` can run this convolution at all.
    pub fn fits(&self, kernel: BlockedKernel) -> bool {
        match kernel {
            BlockedKernel::Winograd => {
                !self.exact
                    && self.kernel == [3, 3]
                    && self.strides == [1, 1]
                    && self.dilations == [1, 1]
                    && self.group == 1
                    && self.blocked_input
            }
            BlockedKernel::Direct => self.group == 1,
            BlockedKernel::Depthwise => self.group == self.cout && self.cin == 1 && self.blocked_input,
        }
    }

    /// The kernel to use, `None` when no blocked kernel fits. Winograd where it fits and
    /// pays (a transformed filter of at most [`WINOGRAD_MAX_BYTES`], at least two blocks of
    /// input channels so the 36 products are real matrix products); `AIM_NO_WINOGRAD` (set
    /// to anything) turns it off, for comparisons.
    pub fn choose(&self) -> Option<BlockedKernel> {
        let winograd_pays = std::env::var_os("AIM_NO_WINOGRAD").is_none()
            && self.cin >= 2 * self.lanes
            && 36 * self.cin * self.cout * 4 <= WINOGRAD_MAX_BYTES;
        [BlockedKernel::Winograd, BlockedKernel::Direct, BlockedKernel::Depthwise]
            .into_iter()
            .filter(|&k| k != BlockedKernel::Winograd || winograd_pays)
            .find(|&k| self.fits(k))
    }
}
