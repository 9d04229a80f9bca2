// The oracle for keel's adapter merge: writes a random LoRA adapter in PEFT's format for a keel
// checkpoint (every attention, DeltaNet and MLP projection; rank 4, alpha 8, B non-zero so the
// adapter matters), and, computed here independently of keel in float64, the merged checkpoint
// W + (alpha / r) B A rounded once to float32.
//
//   node make_adapter.mjs BASE_CHECKPOINT ADAPTER_OUT MERGED_OUT [SEED]
import fs from "node:fs";
import path from "node:path";

const [base, adapterDir, mergedDir, seedArg] = process.argv.slice(2);
if (!mergedDir) { console.error("usage: node make_adapter.mjs BASE_CHECKPOINT ADAPTER_OUT MERGED_OUT [SEED]"); process.exit(2); }
const r = 4, alpha = 8, scale = alpha / r;

function readSafetensors(file) {
    const buf = fs.readFileSync(file);
    const n = Number(buf.readBigUInt64LE(0));
    const head = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"));
    const out = new Map();
    for (const [name, t] of Object.entries(head)) {
        if (name === "__metadata__") continue;
        if (t.dtype !== "F32") throw new Error(`${file}: ${name} is ${t.dtype}; this oracle reads float32 checkpoints`);
        const [a, b] = t.data_offsets;
        out.set(name, {shape: t.shape, data: new Float32Array(new Uint8Array(buf.subarray(8 + n + a, 8 + n + b)).buffer)});
    }
    return out;
}
function writeSafetensors(file, tensors) {
    const head = {};
    let off = 0;
    for (const [name, t] of tensors) head[name] = {dtype: "F32", shape: t.shape, data_offsets: [off, off += t.data.byteLength]};
    let json = JSON.stringify(head);
    json += " ".repeat((8 - (json.length % 8)) % 8);
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
    fs.writeFileSync(file, Buffer.concat([len, Buffer.from(json), ...[...tensors.values()].map(t => Buffer.from(t.data.buffer))]));
}

let state = Number(seedArg ?? 1) >>> 0 || 1; // xorshift32, then Box-Muller
const uniform = () => { state ^= state << 13; state >>>= 0; state ^= state >>> 17; state ^= state << 5; state >>>= 0; return (state + 0.5) / 4294967296; };
const normal = () => Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());

const weights = readSafetensors(path.join(base, "model.safetensors"));
const targets = /\.(self_attn\.(q|k|v|o)_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|mlp\.(gate|up|down)_proj)\.weight$/;
const adapter = new Map(), merged = new Map(weights);
for (const [name, w] of weights) {
    if (!targets.test(name)) continue;
    const [out, inn] = w.shape, stem = name.slice(0, -".weight".length);
    const A = new Float32Array(r * inn).map(() => (2 * uniform() - 1) / Math.sqrt(inn)); // PEFT's kaiming-uniform scale
    const B = new Float32Array(out * r).map(() => 0.05 * normal());
    adapter.set(`base_model.model.${stem}.lora_A.weight`, {shape: [r, inn], data: A});
    adapter.set(`base_model.model.${stem}.lora_B.weight`, {shape: [out, r], data: B});
    const m = new Float32Array(out * inn);
    for (let o = 0; o < out; o++)
        for (let c = 0; c < inn; c++) {
            let s = 0;
            for (let k = 0; k < r; k++) s += B[o * r + k] * A[k * inn + c];
            m[o * inn + c] = w.data[o * inn + c] + scale * s; // float64, one rounding on the store
        }
    merged.set(name, {shape: w.shape, data: m});
}
fs.mkdirSync(adapterDir, {recursive: true});
fs.writeFileSync(path.join(adapterDir, "adapter_config.json"), JSON.stringify({
    peft_type: "LORA", task_type: "CAUSAL_LM", r, lora_alpha: alpha, lora_dropout: 0.0, bias: "none", use_rslora: false,
    use_dora: false, fan_in_fan_out: false, modules_to_save: null, rank_pattern: {}, alpha_pattern: {},
    target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj", "gate_proj", "up_proj", "down_proj"],
    base_model_name_or_path: base}, null, 1));
writeSafetensors(path.join(adapterDir, "adapter_model.safetensors"), adapter);
fs.mkdirSync(mergedDir, {recursive: true});
for (const f of fs.readdirSync(base)) if (f.endsWith(".json") && f !== "trainer_state.json") fs.copyFileSync(path.join(base, f), path.join(mergedDir, f));
writeSafetensors(path.join(mergedDir, "model.safetensors"), merged);
console.log(`adapter: ${adapter.size / 2} LoRA pairs (rank ${r}, alpha ${alpha}); merged checkpoint written`);
