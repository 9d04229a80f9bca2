/* keel: the command-line entry point. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ops/ops.h"

/* THE list of commands: dispatch, `keel --help` and the fallback `keel CMD --help` all read it.
 * own_help: the command prints its --help itself, from its flag table (tools/cli_flags.h); bench's
 * rows (one per subcommand, dispatch goes to the first) and ops are listed from here. */
typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    bool own_help;
    const char *synopsis, *summary;
} command;

static const command COMMANDS[] = {
    {"train", cmd_train, true,
     "train (--model DIR | --preset NAME | --init CONFIG.json | --resume DIR) --data PATH... --out DIR [...]",
     "train or fine-tune a Qwen3.5-family model (keel train --help lists every flag)"},
    {"generate", cmd_generate, true,
     "generate --model DIR (--prompt TEXT | --prompt-ids N,N,...) [--max-tokens N] [--temperature X] [--top-p P] "
     "[--seed N]\n"
     "                 [--tokenizer FILE] [--adapter DIR] [--backend cpu|cuda|ref] [--threads N] [--verify] "
     "[--print-ids] [--dump-logits FILE]\n"
     "                 [--chat [--system TEXT] [--no-thinking] [--chat-template FILE]]",
     "sample from a checkpoint, incrementally (KV cache, DeltaNet states)"},
    {"eval", cmd_eval, true,
     "eval --model DIR --data PATH... [--tokenizer FILE] [--adapter DIR] [--data-format F] [--chat-template FILE]\n"
     "                 [--doc-boundaries on|off] [--no-pack] [--overlong truncate|split|drop] [--precision f32|bf16]\n"
     "                 [--window T] [--batch B] [--backend cpu|cuda|ref] [--threads N]",
     "loss and perplexity of a checkpoint on text (on prompt/completion and chat data: the responses' loss)"},
    {"plot", cmd_plot, true, "plot METRICS.jsonl [--compare METRICS.jsonl...] -o loss.svg",
     "train and eval loss against tokens seen, of one run or several"},
    {"export", cmd_export, true,
     "export gguf CHECKPOINT OUT.gguf [--type f32|f16|bf16|q8_0] [--adapter DIR] [--tokenizer FILE | --byte-vocab]\n"
     "                 [--name NAME]",
     "a GGUF file for llama.cpp, Ollama and LM Studio (keel export --help)"},
    {"merge", cmd_merge, true, "merge BASE ADAPTER OUT [--dtype f32|bf16|f16]",
     "a full checkpoint with a PEFT LoRA adapter merged in (float64, rounded once)"},
    {"save", cmd_save, true, "save SRC OUT [--dtype f32|bf16|f16] [--layout text|multimodal] [--allow-nonfinite]",
     "write a checkpoint folder (as transformers does) and check it reloads bitwise"},
    {"init", cmd_init, true, "init (--preset tiny|small|0.8b | --config CONFIG.json) OUT [--seed N] [--dtype f32|bf16]",
     "a Qwen3.5-family checkpoint with random weights"},
    {"info", cmd_info, true,
     "info CHECKPOINT [--adapter DIR] [--batch B] [--window T] [--recompute MODE] [--precision f32|bf16] [--peak]\n"
     "                 [--run] [--dump-logits FILE] [--threads N]",
     "layers, parameters, training memory per recompute mode; --run times one forward + backward"},
    {"tokenize", cmd_tokenize, true,
     "tokenize --tokenizer FILE [--ids | --tokens] [TEXT | --file PATH | --cases JSON --expect NAME]\n"
     "  tokenize --tokenizer FILE --chat FILE.jsonl [--chat-template FILE] [--add-generation-prompt]",
     "byte-level BPE, identical to Hugging Face tokenizers; --chat: conversations through the chat template"},
    {"diff", cmd_diff, true,
     "diff TRACE_A TRACE_B [--tolerance NMSE]\n"
     "  diff --model DIR [--data FILE] [--tokenizer FILE] [--window T] [--precision f32|bf16] --a CONFIG --b CONFIG\n"
     "                 [--tolerance NMSE]\n"
     "  diff --case acc --a CONFIG --b CONFIG",
     "the first node whose inputs agree but whose output does not (CONFIG: recompute=, threads=, backend=, fault=, "
     "precision=)"},
    {"test-ops", cmd_test_ops, true,
     "test-ops [--backend ref,cpu,cuda] [--op NAME,...] [--grad] [--expect-fault N] [--shard K/N] [--bits]",
     "check every op (and with --grad, every gradient) against the float64 reference"},
    {"test-model", cmd_test_model, true, "test-model [--backend cpu|cuda]",
     "whole-model gradient check: a Qwen3.5 layer pair (plain, LoRA, mixed precision) against finite differences "
     "or ref; packed windows against examples alone"},
    {"test-recompute", cmd_test_recompute, true,
     "test-recompute [--fixture CHECKPOINT] [--backend cpu|cuda] [--precision f32|bf16]",
     "recompute modes off, full, every:2, layers:1,3 give bitwise identical training"},
    {"check-reference", cmd_check_reference, true,
     "check-reference DIR [--backend ref,cpu,cuda] [--checkpoint SUBDIR] [--adapter DIR] [--recompute MODE] "
     "[--threads N]\n"
     "                 [--precision f32|bf16]\n"
     "                 [--trace FILE [--trace-data] [--trace-max-bytes N]]\n"
     "  check-reference SET [--backend ref,cpu,cuda] [--recompute MODE] [--threads N] [--precision f32|bf16]",
     "run DIR/reference.safetensors through each checkpoint in DIR; compare with transformers (SET: a folder of "
     "such fixtures, judged together)"},
    {"bench", cmd_bench, false,
     "bench matmul [--sizes 512,1024,2048,4096] [--threads N] [--reps N] [--model-shapes] [--bf16]",
     "cpu matrix product (float32, or bf16 operands): GFLOP/s next to OpenBLAS, BLIS (when installed) and the "
     "CPU's peak"},
    {"bench", cmd_bench, false, "bench recompute [--window T] [--layers L] [--threads N]",
     "peak memory (planned and measured) and step time per recompute mode"},
    {"bench", cmd_bench, false, "bench tokenize [--tokenizer FILE] [--text FILE] [--reps N]",
     "MB/s next to the npm Qwen3 tokenizer (node) on the same text; ids compared"},
    {"bench", cmd_bench, false,
     "bench train [--backend cuda|cpu] [--preset 0.8b] [--batch 4] [--window 1024] [--steps 5] [--warmup 2]\n"
     "                 [--recompute MODE] [--threads N] [--torch bench/torch_qwen35.py] [--python python3] "
     "[--no-torch]\n"
     "                 [--lora-rank R [--base-dtype f32|bf16]] [--precision f32|bf16]",
     "training steps of a Qwen3.5-0.8B-shaped model next to PyTorch + transformers (and LoRA next to full "
     "fine-tuning), tokens/s and peak memory"},
    {"ops", cmd_ops, false, "ops", "list the op table"},
};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

static void usage(FILE *f) {
    fprintf(f, "usage: keel <command> [options]     (keel <command> --help: one command)\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %s\n                 %s\n", COMMANDS[i].synopsis, COMMANDS[i].summary);
    fprintf(f, "\nenvironment: KEEL_FAULT=copy-row-limit:N makes the cpu copy path copy only N elements per row\n"
               "(the fault the op tests must catch).\n");
}

/* keel CMD --help for a command without a --help of its own: its rows of the table. */
static int command_help(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(COMMANDS[i].name, name) == 0)
            printf("usage: keel %s\n  %s\n", COMMANDS[i].synopsis, COMMANDS[i].summary);
    return 0;
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
    static const char *fam[] = {"leaf", "view", "copy", "unary", "binary", "rows", "matmul", "own"};
    for (int op = 1; op < KEEL_OP_COUNT; op++) {
        const keel_op_info *i = keel_op_get(op);
        printf("%-26s %-7s arity %d  %-9s %s\n", i->name, fam[i->family], i->arity, i->grad_srcs ? "grad" : "no-grad",
               i->params);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const command *c = &COMMANDS[i];
        if (strcmp(c->name, cmd)) continue;
        bool help = argc >= 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0);
        if (help && !c->own_help) return command_help(cmd);
        return c->fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "keel: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
