/* Two custom operators in one library, for aim's custom-op ABI (include/aim.h):
 *
 *   com.example:ScaleShift  y = x * scale + shift      (float attributes scale, shift)
 *   com.example:PairSum     y[..., i] = x[..., 2i] + x[..., 2i+1]   (last dim halved)
 *
 * Both take and give f32; PairSum spreads its rows over aim's threads (AimCustomHost). A node attribute `fail` = 1 makes compute fail, and
 * `bad_shape` = 1 makes it change its output's shape, to show how aim reports a kernel's
 * errors. Build: cc -shared -fPIC -O2 -I include examples/custom_op/custom_ops.c -o libcustom_ops.so
 * Use: aim run model.onnx --custom-ops ./libcustom_ops.so */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aim.h"

/* The attribute `name` of kind `kind`, or null. */
static const AimCustomAttribute *attr(const AimCustomAttribute *a, size_t n, const char *name, int kind) {
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == kind && strcmp(a[i].name, name) == 0) return &a[i];
    return NULL;
}

static float attr_float(const AimCustomAttribute *a, size_t n, const char *name, float dflt) {
    const AimCustomAttribute *f = attr(a, n, name, 2);
    if (f) return f->float_value;
    const AimCustomAttribute *i = attr(a, n, name, 1);
    return i ? (float)i->int_value : dflt;
}

static int64_t attr_int(const AimCustomAttribute *a, size_t n, const char *name, int64_t dflt) {
    const AimCustomAttribute *i = attr(a, n, name, 1);
    return i ? i->int_value : dflt;
}

/* A kernel instance: the node's attributes, read once at create. */
typedef struct {
    float scale, shift;
    int fail, bad_shape;
} Kernel;

static void *create(void *user_data, const AimCustomAttribute *attrs, size_t n, char *error, size_t error_len) {
    (void)user_data;
    Kernel *k = malloc(sizeof(Kernel));
    if (!k) {
        snprintf(error, error_len, "out of memory");
        return NULL;
    }
    k->scale = attr_float(attrs, n, "scale", 1.0f);
    k->shift = attr_float(attrs, n, "shift", 0.0f);
    k->fail = (int)attr_int(attrs, n, "fail", 0);
    k->bad_shape = (int)attr_int(attrs, n, "bad_shape", 0);
    return k;
}

static void destroy(void *kernel) { free(kernel); }

/* One f32 input of known rank, one output. */
static int check_io(const AimCustomType *in, size_t num_in, size_t num_out, char *error, size_t error_len) {
    if (num_in != 1 || num_out != 1) {
        snprintf(error, error_len, "takes one input and one output, got %zu and %zu", num_in, num_out);
        return 1;
    }
    if (in[0].dtype != AIM_DTYPE_F32 && in[0].dtype != AIM_DTYPE_UNDEFINED) {
        snprintf(error, error_len, "takes f32, got dtype code %d", in[0].dtype);
        return 1;
    }
    return 0;
}

static int scale_shift_infer(void *user_data, const AimCustomAttribute *attrs, size_t num_attrs,
                             const AimCustomType *in, size_t num_in, AimCustomType *out, size_t num_out,
                             char *error, size_t error_len) {
    (void)user_data, (void)attrs, (void)num_attrs;
    if (check_io(in, num_in, num_out, error, error_len)) return 1;
    out[0] = in[0];
    out[0].dtype = AIM_DTYPE_F32;
    return 0;
}

static int scale_shift_compute(void *kernel, const AimCustomTensor *in, size_t num_in, AimCustomTensor *out,
                               size_t num_out, const AimCustomHost *host, char *error, size_t error_len) {
    (void)num_in, (void)num_out, (void)host;
    const Kernel *k = kernel;
    if (k->fail) {
        snprintf(error, error_len, "asked to fail by the node's 'fail' attribute");
        return 7;
    }
    const float *x = in[0].data;
    float *y = out[0].data;
    for (size_t i = 0; i < out[0].bytes / sizeof(float); i++) y[i] = x[i] * k->scale + k->shift;
    if (k->bad_shape) out[0].ty.dims[0] += 1;
    return 0;
}

static int pair_sum_infer(void *user_data, const AimCustomAttribute *attrs, size_t num_attrs,
                          const AimCustomType *in, size_t num_in, AimCustomType *out, size_t num_out, char *error,
                          size_t error_len) {
    (void)user_data, (void)attrs, (void)num_attrs;
    if (check_io(in, num_in, num_out, error, error_len)) return 1;
    out[0] = in[0];
    out[0].dtype = AIM_DTYPE_F32;
    if (in[0].rank >= 1) {
        int64_t last = in[0].dims[in[0].rank - 1];
        if (last >= 0 && last % 2) {
            snprintf(error, error_len, "the last dim (%lld) must be even", (long long)last);
            return 1;
        }
        out[0].dims[in[0].rank - 1] = last < 0 ? -1 : last / 2;
    }
    return 0;
}

/* PairSum's rows, one task each on aim's threads. */
typedef struct {
    const float *x;
    float *y;
    size_t row;
} Rows;

static void pair_sum_row(void *ctx, size_t r) {
    const Rows *t = ctx;
    for (size_t i = r * t->row; i < (r + 1) * t->row; i++) t->y[i] = t->x[2 * i] + t->x[2 * i + 1];
}

static int pair_sum_compute(void *kernel, const AimCustomTensor *in, size_t num_in, AimCustomTensor *out,
                            size_t num_out, const AimCustomHost *host, char *error, size_t error_len) {
    (void)kernel, (void)num_in, (void)num_out, (void)error, (void)error_len;
    size_t n = out[0].bytes / sizeof(float), row = out[0].ty.rank ? (size_t)out[0].ty.dims[out[0].ty.rank - 1] : 1;
    Rows t = {in[0].data, out[0].data, row};
    size_t rows = row ? n / row : 0;
    if (host && host->struct_size >= sizeof(AimCustomHost) && host->parallel_for)
        host->parallel_for(host->pool, rows, pair_sum_row, &t);
    else
        for (size_t r = 0; r < rows; r++) pair_sum_row(&t, r);
    return 0;
}

static const AimCustomOp SCALE_SHIFT = {
    .abi_version = AIM_CUSTOM_OP_ABI_VERSION,
    .struct_size = sizeof(AimCustomOp),
    .domain = "com.example",
    .name = "ScaleShift",
    .flags = AIM_CUSTOM_OP_THREAD_SAFE,
    .infer = scale_shift_infer,
    .create = create,
    .compute = scale_shift_compute,
    .destroy = destroy,
};

static const AimCustomOp PAIR_SUM = {
    .abi_version = AIM_CUSTOM_OP_ABI_VERSION,
    .struct_size = sizeof(AimCustomOp),
    .domain = "com.example",
    .name = "PairSum",
    .infer = pair_sum_infer,
    .compute = pair_sum_compute,
};

static const AimCustomOp *const OPS[] = {&SCALE_SHIFT, &PAIR_SUM};

const AimCustomOp *const *aim_custom_ops(uint32_t abi_version, size_t *count) {
    if (abi_version < AIM_CUSTOM_OP_ABI_VERSION) return NULL;
    *count = sizeof(OPS) / sizeof(OPS[0]);
    return OPS;
}
