/* Runs a model through aim's C API, as a host application would.
 *
 *   run_model MODEL INPUT.bin OUTPUT.bin [DIMS] [THREADS]
 *
 * Loads MODEL (.onnx) with libaim, prints its inputs and outputs, reads the first input's
 * elements from INPUT.bin (raw little-endian, dense), runs the model twice (once into an
 * owned output list, once into a buffer of our own) and writes the first output's bytes
 * to OUTPUT.bin after checking both runs agree. DIMS (like 1x3x224x224) gives the input's
 * shape where the model leaves dims dynamic. Exit status 0 on success, 1 with aim's
 * message on stderr otherwise.
 *
 * Build: gcc -O2 -Iinclude examples/c/run_model.c -Ltarget/release -laim -o run_model
 */
#include "aim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        fprintf(stderr, "usage: %s MODEL INPUT.bin OUTPUT.bin [DIMS] [THREADS]\n", argv[0]);
        return 2;
    }
    printf("libaim %s (ABI %u)\n", aim_version(), aim_abi_version());
    if (aim_abi_version() != AIM_ABI_VERSION) {
        fprintf(stderr, "run_model: built for ABI %u, loaded %u\n", AIM_ABI_VERSION, aim_abi_version());
        return 1;
    }
    AimLoadOptions options = {0};
    options.threads = argc > 5 ? (uint32_t)atoi(argv[5]) : 0;
    AimModel *model = NULL;
    if (aim_model_load(argv[1], &options, &model) != AIM_STATUS_OK) return fail("load");

    AimTensorInfo in_info, out_info;
    for (size_t i = 0; i < aim_model_input_count(model); i++) {
        if (aim_model_input(model, i, &in_info) != AIM_STATUS_OK) return fail("input");
        print_info("input", &in_info);
    }
    for (size_t i = 0; i < aim_model_output_count(model); i++) {
        if (aim_model_output(model, i, &out_info) != AIM_STATUS_OK) return fail("output");
        print_info("output", &out_info);
    }
    if (aim_model_input(model, 0, &in_info) != AIM_STATUS_OK) return fail("input 0");

    int64_t shape[16];
    size_t rank = 0;
    if (argc > 4) {
        for (char *p = argv[4]; *p && rank < 16; rank++) {
            shape[rank] = strtoll(p, &p, 10);
            if (*p == 'x') p++;
        }
    } else {
        if (in_info.rank < 0 || in_info.rank > 16) {
            fprintf(stderr, "run_model: the input's rank is not declared: give DIMS\n");
            return 2;
        }
        rank = (size_t)in_info.rank;
        for (size_t d = 0; d < rank; d++) {
            if (in_info.shape[d] < 0) {
                fprintf(stderr, "run_model: dim %zu of '%s' is dynamic: give DIMS\n", d, in_info.name);
                return 2;
            }
            shape[d] = in_info.shape[d];
        }
    }
    size_t len = 0;
    void *data = read_file(argv[2], &len);
    if (!data) {
        perror(argv[2]);
        return 1;
    }
    AimTensor input = {in_info.name, in_info.dtype, rank, shape, data, len};

    AimOutputs *outputs = NULL;
    if (aim_model_run(model, &input, 1, &outputs) != AIM_STATUS_OK) return fail("run");
    AimTensor first;
    if (aim_outputs_get(outputs, 0, &first) != AIM_STATUS_OK) return fail("outputs");
    size_t elems = first.byte_len / dtype_size(first.dtype);
    printf("%s: %zu elements, %zu bytes\n", first.name, elems, first.byte_len);

    /* The same run into a buffer the host owns. */
    void *mine = malloc(first.byte_len ? first.byte_len : 1);
    AimBuffer buffer = {first.name, mine, first.byte_len};
    if (aim_model_run_into(model, &input, 1, &buffer, 1) != AIM_STATUS_OK) return fail("run_into");
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
    AimTensor wrong = input;
    wrong.byte_len = len / 2;
    AimOutputs *none = NULL;
    if (aim_model_run(model, &wrong, 1, &none) == AIM_STATUS_OK || none != NULL) {
        fprintf(stderr, "run_model: a half-sized input was accepted\n");
        return 1;
    }
    printf("a half-sized input is refused: %s\n", aim_last_error());

    aim_outputs_free(outputs);
    free(mine);
    free(data);
    aim_model_free(model);
    return 0;
}
