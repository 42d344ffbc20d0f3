/* Runs a model through aim's C API, as a host application would.
 *
 *   run_model MODEL INPUT.bin OUTPUT.bin [DIMS] [THREADS] [TIMED_RUNS]
 *
 * Loads MODEL — an ONNX or .aim file with libaim's JIT (aim_model_load), or a shared
 * object from `aim compile --target ... -o libNAME.so`, opened with dlopen and loaded by
 * its NAME_load — prints its inputs and outputs, reads each input's elements from INPUT.bin
 * (raw little-endian, dense; several inputs: files separated by commas, in the model's
 * input order), runs the model twice (once into an owned output list, once into a buffer
 * of our own) and writes the first output's bytes to OUTPUT.bin after checking both runs
 * agree. DIMS (like 1x3x224x224; several inputs: separated by commas) gives the inputs'
 * shapes where the model leaves dims dynamic. With TIMED_RUNS, it then runs that many more times and
 * prints the median latency. With the environment variable AIM_CUSTOM_OPS naming a custom-op
 * library (examples/custom_op/), it registers that library first. Exit status 0 on success,
 * 1 with aim's message on stderr otherwise.
 *
 * Build against the JIT (every kind of MODEL):
 *   gcc -O2 -Iinclude examples/c/run_model.c -Ltarget/release -laim -ldl -o run_model
 * or against the runtime alone (compiled shared objects only):
 *   gcc -O2 -DAIM_RUNTIME_ONLY -Iinclude examples/c/run_model.c -Ltarget/release \
 *       -laim_runtime -ldl -o run_model_rt
 */
#define _DEFAULT_SOURCE /* strsep, strdup, clock_gettime */
#include "aim.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(const char *what) {
    fprintf(stderr, "run_model: %s: %s\n", what, aim_last_error());
    return 1;
}

static size_t dtype_size(int32_t dtype) {
    switch (dtype) {
    case AIM_DTYPE_F64: case AIM_DTYPE_I64: case AIM_DTYPE_U64: return 8;
    case AIM_DTYPE_F32: case AIM_DTYPE_I32: case AIM_DTYPE_U32: return 4;
    case AIM_DTYPE_F16: case AIM_DTYPE_BF16: case AIM_DTYPE_I16: case AIM_DTYPE_U16: return 2;
    default: return 1;
    }
}

static void print_info(const char *kind, const AimTensorInfo *info) {
    printf("%s %s: dtype %d, shape [", kind, info->name, info->dtype);
    for (int64_t d = 0; d < info->rank; d++) printf(d ? ", %lld" : "%lld", (long long)info->shape[d]);
    printf("]\n");
}

/* The entry a compiled object exports: libresnet-50.so gives resnet_50_load (aim compile's
 * default --name). */
typedef AimStatus (*EntryFn)(const AimLoadOptions *, AimModel **);

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static AimStatus load_shared_object(const char *path, const AimLoadOptions *options, AimModel **model) {
    /* dlopen searches the library path for a bare file name: name the file itself. */
    char local[4096];
    if (!strchr(path, '/') && strlen(path) + 3 < sizeof local) {
        snprintf(local, sizeof local, "./%s", path);
    } else {
        snprintf(local, sizeof local, "%s", path);
    }
    void *lib = dlopen(local, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "run_model: %s\n", dlerror());
        return AIM_STATUS_LOAD_FAILED;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (strncmp(base, "lib", 3) == 0) base += 3;
    char entry[256];
    size_t n = 0;
    if (isdigit((unsigned char)*base)) n = (size_t)snprintf(entry, sizeof entry, "model_");
    for (; *base && *base != '.' && n + 6 < sizeof entry; base++) entry[n++] = isalnum((unsigned char)*base) ? *base : '_';
    strcpy(entry + n, "_load");
    EntryFn load;
    *(void **)&load = dlsym(lib, entry);
    if (!load) {
        fprintf(stderr, "run_model: %s has no %s\n", path, entry);
        return AIM_STATUS_LOAD_FAILED;
    }
    return load(options, model);
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(data, 1, (size_t)n, f);
    fclose(f);
    return data;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL INPUT.bin OUTPUT.bin [DIMS] [THREADS] [TIMED_RUNS]\n", argv[0]);
        return 2;
    }
    printf("libaim %s (ABI %u)\n", aim_version(), aim_abi_version());
    if (aim_abi_version() != AIM_ABI_VERSION) {
        fprintf(stderr, "run_model: built for ABI %u, loaded %u\n", AIM_ABI_VERSION, aim_abi_version());
        return 1;
    }
    /* A custom-op library to register before loading (see AimCustomOp in aim.h), if named. */
    const char *custom_ops = getenv("AIM_CUSTOM_OPS");
    if (custom_ops && *custom_ops && aim_register_custom_ops_library(custom_ops) != AIM_STATUS_OK)
        return fail("custom ops");
    AimLoadOptions options = {0};
    options.threads = argc > 5 ? (uint32_t)atoi(argv[5]) : 0;
    AimModel *model = NULL;
    AimStatus loaded;
    if (ends_with(argv[1], ".so")) {
        loaded = load_shared_object(argv[1], &options, &model);
    } else {
#ifdef AIM_RUNTIME_ONLY
        fprintf(stderr, "run_model: built against libaim_runtime, which runs compiled shared objects only\n");
        return 2;
#else
        loaded = aim_model_load(argv[1], &options, &model);
#endif
    }
    if (loaded != AIM_STATUS_OK) return fail("load");

    AimTensorInfo in_info, out_info;
    for (size_t i = 0; i < aim_model_input_count(model); i++) {
        if (aim_model_input(model, i, &in_info) != AIM_STATUS_OK) return fail("input");
        print_info("input", &in_info);
    }
    for (size_t i = 0; i < aim_model_output_count(model); i++) {
        if (aim_model_output(model, i, &out_info) != AIM_STATUS_OK) return fail("output");
        print_info("output", &out_info);
    }
    /* INPUT.bin and DIMS list one entry per input, separated by commas. */
    size_t n_inputs = aim_model_input_count(model);
    if (n_inputs > 8) {
        fprintf(stderr, "run_model: the model has %zu inputs; this example feeds at most 8\n", n_inputs);
        return 2;
    }
    AimTensor inputs[8];
    int64_t shapes[8][16];
    void *datas[8] = {0};
    char *files = strdup(argv[2]), *dims = argc > 4 ? strdup(argv[4]) : NULL;
    char *file_next = files, *dims_next = dims;
    for (size_t i = 0; i < n_inputs; i++) {
        if (aim_model_input(model, i, &in_info) != AIM_STATUS_OK) return fail("input");
        char *file = strsep(&file_next, ",");
        if (!file) {
            fprintf(stderr, "run_model: no INPUT.bin for input %zu ('%s')\n", i, in_info.name);
            return 2;
        }
        char *dim = dims_next ? strsep(&dims_next, ",") : NULL;
        size_t rank = 0;
        if (dim) {
            for (char *p = dim; *p && rank < 16; rank++) {
                shapes[i][rank] = strtoll(p, &p, 10);
                if (*p == 'x') p++;
            }
        } else {
            if (in_info.rank < 0 || in_info.rank > 16) {
                fprintf(stderr, "run_model: the rank of '%s' is not declared: give DIMS\n", in_info.name);
                return 2;
            }
            rank = (size_t)in_info.rank;
            for (size_t d = 0; d < rank; d++) {
                if (in_info.shape[d] < 0) {
                    fprintf(stderr, "run_model: dim %zu of '%s' is dynamic: give DIMS\n", d, in_info.name);
                    return 2;
                }
                shapes[i][d] = in_info.shape[d];
            }
        }
        size_t len = 0;
        datas[i] = read_file(file, &len);
        if (!datas[i]) {
            perror(file);
            return 1;
        }
        AimTensor t = {in_info.name, in_info.dtype, rank, shapes[i], datas[i], len};
        inputs[i] = t;
    }

    AimOutputs *outputs = NULL;
    if (aim_model_run(model, inputs, n_inputs, &outputs) != AIM_STATUS_OK) return fail("run");
    AimTensor first;
    if (aim_outputs_get(outputs, 0, &first) != AIM_STATUS_OK) return fail("outputs");
    size_t elems = first.byte_len / dtype_size(first.dtype);
    printf("%s: %zu elements, %zu bytes\n", first.name, elems, first.byte_len);

    /* The same run into a buffer the host owns. */
    void *mine = malloc(first.byte_len ? first.byte_len : 1);
    AimBuffer buffer = {first.name, mine, first.byte_len};
    if (aim_model_run_into(model, inputs, n_inputs, &buffer, 1) != AIM_STATUS_OK) return fail("run_into");
    if (memcmp(mine, first.data, first.byte_len) != 0) {
        fprintf(stderr, "run_model: the two runs differ\n");
        return 1;
    }

    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(first.data, 1, first.byte_len, f) != first.byte_len) {
        perror(argv[3]);
        return 1;
    }
    fclose(f);

    /* A wrong input is an error with a message, not a crash. */
    AimTensor wrong[8];
    memcpy(wrong, inputs, sizeof(AimTensor) * n_inputs);
    wrong[0].byte_len /= 2;
    AimOutputs *none = NULL;
    if (aim_model_run(model, wrong, n_inputs, &none) == AIM_STATUS_OK || none != NULL) {
        fprintf(stderr, "run_model: a half-sized input was accepted\n");
        return 1;
    }
    printf("a half-sized input is refused: %s\n", aim_last_error());

    int timed = argc > 6 ? atoi(argv[6]) : 0;
    if (timed > 0) {
        double *ms = malloc(sizeof(double) * (size_t)timed);
        for (int i = 0; i < timed; i++) {
            double t0 = now_ms();
            if (aim_model_run_into(model, inputs, n_inputs, &buffer, 1) != AIM_STATUS_OK) return fail("timed run");
            ms[i] = now_ms() - t0;
        }
        qsort(ms, (size_t)timed, sizeof(double), by_value);
        printf("median %.4f ms over %d runs\n", ms[timed / 2], timed);
        free(ms);
    }

    aim_outputs_free(outputs);
    free(mine);
    for (size_t i = 0; i < n_inputs; i++) free(datas[i]);
    free(files);
    free(dims);
    aim_model_free(model);
    return 0;
}
