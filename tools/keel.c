/* keel: the command-line entry point. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ops/ops.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: keel <command> [options]\n"
            "\n"
            "commands:\n"
            "  train (--model DIR | --preset NAME | --init CONFIG.json | --resume DIR) --data PATH... --out DIR [...]\n"
            "                 train or fine-tune a Qwen3.5-family model (keel train --help)\n"
            "  generate --model DIR --prompt TEXT [--max-tokens N] [--temperature X] [--top-p P] [--seed N] [--verify]\n"
            "                 sample from a checkpoint, incrementally (KV cache, DeltaNet states)\n"
            "  eval --model DIR --data PATH... [--tokenizer FILE] [--window T] [--batch B]\n"
            "                 loss and perplexity of a checkpoint on text\n"
            "  plot METRICS.jsonl -o loss.svg\n"
            "                 train and eval loss against tokens seen\n"
            "  test-ops [--backend ref,cpu] [--op NAME,...] [--grad] [--expect-fault N]\n"
            "                 check every op (and with --grad, every gradient) against the float64 reference\n"
            "  test-model     whole-model gradient check: a Qwen3.5 layer pair against finite differences\n"
            "  test-recompute [--fixture CHECKPOINT]\n"
            "                 recompute modes off, full, every:2, layers:1,3 give bitwise identical training\n"
            "  check-reference DIR [--backend ref,cpu] [--checkpoint SUBDIR] [--recompute MODE]\n"
            "                 run DIR/reference.safetensors through each checkpoint in DIR; compare with transformers\n"
            "  tokenize --tokenizer FILE [--ids | --tokens] [TEXT | --file PATH | --cases JSON --expect NAME]\n"
            "                 byte-level BPE, identical to Hugging Face tokenizers\n"
            "  diff TRACE_A TRACE_B | diff --model DIR [--data FILE] --a CONFIG --b CONFIG | diff --case acc ...\n"
            "                 the first node whose inputs agree but whose output does not\n"
            "  save SRC OUT [--dtype f32|bf16|f16] [--layout text|multimodal]\n"
            "                 write a checkpoint folder (as transformers does) and check it reloads bitwise\n"
            "  init --preset tiny|small|0.8b OUT [--seed N] [--dtype f32|bf16]\n"
            "                 a Qwen3.5-family checkpoint with random weights\n"
            "  export gguf CHECKPOINT OUT.gguf [--type f32|f16|bf16|q8_0] [--tokenizer FILE]\n"
            "                 a GGUF file for llama.cpp, Ollama and LM Studio (keel export --help)\n"
            "  info CHECKPOINT [--batch B] [--window T] [--recompute MODE] [--run] [--dump-logits FILE]\n"
            "                 layers, parameters, training memory per recompute mode; --run times one forward + backward\n"
            "  bench matmul [--sizes 512,1024,2048,4096] [--threads N]\n"
            "                 cpu float32 matrix product: GFLOP/s next to OpenBLAS and the CPU's peak\n"
            "  bench recompute [--window T] [--layers L]\n"
            "                 peak memory (planned and measured) and step time per recompute mode\n"
            "  bench tokenize [--tokenizer FILE] [--text FILE]\n"
            "                 MB/s next to the npm Qwen3 tokenizer (node) on the same text; ids compared\n"

            "  ops            list the op table\n"
            "\n"
            "environment: KEEL_FAULT=copy-row-limit:N makes the cpu copy path copy only N elements per row\n"
            "(the fault the op tests must catch).\n");
}

long long cli_int(const char *flag, const char *value, long long min) {
    if (!value) {
        fprintf(stderr, "keel: %s needs a value\n", flag);
        return -1;
    }
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || *end || end == value || v < min) {
        fprintf(stderr, "keel: %s expects an integer >= %lld, got '%s'\n", flag, min, value);
        return -1;
    }
    return v;
}

int cmd_ops(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "keel ops: unexpected argument '%s'\n", argv[1]);
        return 2;
    }
    for (int op = 1; op < KEEL_OP_COUNT; op++) {
        const keel_op_info *i = keel_op_get(op);
        printf("%-26s arity %d  %-9s %s\n", i->name, i->arity, i->grad_srcs ? "grad" : "no-grad", i->params);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "test-ops") == 0) return cmd_test_ops(argc - 1, argv + 1);
    if (strcmp(cmd, "test-model") == 0) return cmd_test_model(argc - 1, argv + 1);
    if (strcmp(cmd, "check-reference") == 0) return cmd_check_reference(argc - 1, argv + 1);
    if (strcmp(cmd, "test-recompute") == 0) return cmd_test_recompute(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0) return cmd_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0) return cmd_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0) return cmd_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "plot") == 0) return cmd_plot(argc - 1, argv + 1);
    if (strcmp(cmd, "diff") == 0) return cmd_diff(argc - 1, argv + 1);
    if (strcmp(cmd, "save") == 0) return cmd_save(argc - 1, argv + 1);
    if (strcmp(cmd, "init") == 0) return cmd_init(argc - 1, argv + 1);
    if (strcmp(cmd, "info") == 0) return cmd_info(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "export") == 0) return cmd_export(argc - 1, argv + 1);
    if (strcmp(cmd, "ops") == 0) return cmd_ops(argc - 1, argv + 1);
    fprintf(stderr, "keel: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
