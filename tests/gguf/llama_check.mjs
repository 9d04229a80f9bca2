// Runs a GGUF file in llama.cpp (node-llama-cpp's prebuilt libraries, CPU) and compares it with
// keel on the same checkpoint: the next-token probabilities at every position of a fixed input,
// the perplexity of that input, and greedy continuations.
//
//   node llama_check.mjs --gguf FILE --keel LOGITS.safetensors --keel-greedy N,N,... [--prob-tol X]
//        [--greedy-n N] [--ppl-tol X] [--text-out FILE] [--label NAME] [--tokenizer-config FILE]
//
// LOGITS.safetensors is what `keel generate --dump-logits` writes: input_ids [T] and keel's float32
// logits [T, V] of the same checkpoint; --keel-greedy is keel's greedy continuation (its
// `--print-ids` output after the prompt). With --tokenizer-config, the GGUF's chat template and
// end-of-sequence token must be that tokenizer_config.json's. Exits 1 when a check fails, 2 on bad
// arguments.
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

const args = {"prob-tol": "1e-4", "greedy-n": "32", "ppl-tol": "0.02", label: ""};
for (let i = 2; i < process.argv.length; i += 2) {
    const k = process.argv[i].replace(/^--/, "");
    if (!(k in args) && !["gguf", "keel", "keel-greedy", "text-out", "tokenizer-config"].includes(k) || i + 1 >= process.argv.length) {
        console.error(`llama_check: unknown or incomplete option '${process.argv[i]}'`);
        process.exit(2);
    }
    args[k] = process.argv[i + 1];
}
for (const k of ["gguf", "keel", "keel-greedy"]) if (args[k] === undefined) { console.error(`llama_check: --${k} is required`); process.exit(2); }
const probTol = Number(args["prob-tol"]), greedyN = Number(args["greedy-n"]), pplTol = Number(args["ppl-tol"]);

// keel's side: a safetensors file (8-byte header length, JSON header, data).
function readSafetensors(file) {
    const buf = fs.readFileSync(file);
    const n = Number(buf.readBigUInt64LE(0));
    const head = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"));
    const out = {};
    for (const [name, t] of Object.entries(head)) {
        if (name === "__metadata__") continue;
        const [a, b] = t.data_offsets;
        const bytes = buf.subarray(8 + n + a, 8 + n + b);
        const copy = new Uint8Array(bytes); // aligned copy
        out[name] = {shape: t.shape, data: t.dtype === "I32" ? new Int32Array(copy.buffer) : new Float32Array(copy.buffer)};
    }
    return out;
}
const keel = readSafetensors(args.keel);
const ids = Array.from(keel.input_ids.data);
const [T, V] = keel.logits.shape;
const keelGreedy = args["keel-greedy"].split(",").filter(s => s !== "").map(Number);

// softmax in float64 of keel's float32 logits at position t
function keelProbs(t) {
    const lg = keel.logits.data.subarray(t * V, (t + 1) * V);
    let mx = -Infinity;
    for (let k = 0; k < V; k++) mx = Math.max(mx, lg[k]);
    const p = new Float64Array(V);
    let z = 0;
    for (let k = 0; k < V; k++) z += (p[k] = Math.exp(lg[k] - mx));
    for (let k = 0; k < V; k++) p[k] /= z;
    return p;
}

const here = path.dirname(fileURLToPath(import.meta.url));
const {getLlama} = await import(path.join(here, "node_modules", "node-llama-cpp", "dist", "index.js"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error", progressLogs: false});
const model = await llama.loadModel({modelPath: args.gguf});
if (model.fileInfo.metadata.general.architecture !== "qwen35") {
    console.error(`llama_check: ${args.gguf}: architecture ${model.fileInfo.metadata.general.architecture}, expected qwen35`);
    process.exit(1);
}
// float32 key/value cache and no flash attention: nothing in llama.cpp rounds below the weights' type
const ctx = await model.createContext({contextSize: 256, batchSize: 256, threads: 2, flashAttention: false,
                                       experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
const seq = ctx.getSequence();
const nVocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
if (nVocab !== V) { console.error(`llama_check: the GGUF vocabulary has ${nVocab} tokens, keel's logits ${V}`); process.exit(1); }

// the input one token at a time, the full distribution after each
let worst = 0, worstAt = -1, nllKeel = 0, nllLlama = 0, next = -1;
for (let t = 0; t < T; t++) {
    const [r] = await seq.controlledEvaluate([[ids[t], {generateNext: {probabilities: true}}]]);
    const pl = r.next.probabilities, pk = keelProbs(t);
    if (pl.size !== V) { console.error(`llama_check: position ${t}: llama.cpp gave ${pl.size} probabilities, expected ${V}`); process.exit(1); }
    for (const [tok, p] of pl) {
        const d = Math.abs(p - pk[tok]);
        if (!(d <= worst)) worst = d, worstAt = t; // NaN counts as the worst
    }
    if (t + 1 === T) next = pl.keys().next().value;
    if (t + 1 < T) nllKeel -= Math.log(pk[ids[t + 1]]), nllLlama -= Math.log(pl.get(ids[t + 1]));
}
const pplKeel = Math.exp(nllKeel / (T - 1)), pplLlama = Math.exp(nllLlama / (T - 1)), pplDiff = Math.abs(pplLlama / pplKeel - 1);

// greedy continuation after the input: the first token is the most probable after the last input
// token (the map is sorted), then one token at a time with llama.cpp's greedy sampler
const greedy = [];
for (let i = 0; i < greedyN; i++) {
    greedy.push(next);
    if (i + 1 < greedyN) next = (await seq.controlledEvaluate([[next, {generateNext: {token: true, options: {temperature: 0}}}]]))[0].next.token;
}
// what llama.cpp reads of the tokenizer's configuration
let okTok = true;
if (args["tokenizer-config"]) {
    const tc = JSON.parse(fs.readFileSync(args["tokenizer-config"], "utf8"));
    const eosText = typeof tc.eos_token === "string" ? tc.eos_token : tc.eos_token?.content;
    const eosGot = model.detokenize([model.tokens.eos], true);
    const tmpl = model.fileInfo.metadata.tokenizer.chat_template;
    okTok = tmpl === tc.chat_template && eosGot === eosText;
    console.log(`${args.label}: chat template ${tmpl === tc.chat_template ? "identical" : "DIFFERS"} (${(tmpl ?? "").length} chars), ` +
                `end of sequence ${JSON.stringify(eosGot)} (tokenizer_config.json: ${JSON.stringify(eosText)}) ${okTok ? "ok" : "FAIL"}`);
}
let agree = 0;
while (agree < greedyN && agree < keelGreedy.length && greedy[agree] === keelGreedy[agree]) agree++;
if (args["text-out"]) fs.writeFileSync(args["text-out"], model.detokenize([...ids, ...greedy]));

const okProb = worst <= probTol, okPpl = pplDiff <= pplTol, okGreedy = agree === greedyN;
console.log(`${args.label}${args.label ? ": " : ""}${T} positions x ${V} tokens: max |p_llama.cpp - p_keel| ${worst.toExponential(2)} ` +
            `(position ${worstAt}, limit ${probTol.toExponential(0)}) ${okProb ? "ok" : "FAIL"}; perplexity keel ${pplKeel.toFixed(4)} ` +
            `llama.cpp ${pplLlama.toFixed(4)} (${(100 * pplDiff).toFixed(3)}%, limit ${(100 * pplTol).toFixed(1)}%) ${okPpl ? "ok" : "FAIL"}; ` +
            `greedy ${agree}/${greedyN} tokens agree ${okGreedy ? "ok" : "FAIL"}`);
if (!okGreedy) console.log(`  keel      ${keelGreedy.slice(0, greedyN).join(",")}\n  llama.cpp ${greedy.join(",")}`);
await model.dispose();
process.exit(okProb && okPpl && okGreedy && okTok ? 0 : 1);
