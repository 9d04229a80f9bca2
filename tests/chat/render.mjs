// transformers.js's apply_chat_template (npm @huggingface/transformers, pinned by package-lock.json)
// on each conversation of a JSON Lines file, with a local tokenizer folder (tokenizer.json +
// tokenizer_config.json, offline): one JSON line out per conversation, {"line", "text", "ids"},
// as `keel tokenize --chat` prints them.
// Usage: node render.mjs TOKENIZER_DIR CONVERSATIONS.jsonl
import { AutoTokenizer, env } from "@huggingface/transformers";
import fs from "node:fs";
import path from "node:path";

const [dir, file] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(dir)) + "/";
const tok = await AutoTokenizer.from_pretrained(path.basename(path.resolve(dir)));
const lines = fs.readFileSync(file, "utf8").split("\n");
for (let i = 0; i < lines.length; i++) {
  if (!lines[i]) continue;
  const c = JSON.parse(lines[i]);
  const { messages, add_generation_prompt = false, ...extra } = c;
  const opts = { add_generation_prompt, ...extra };
  const text = tok.apply_chat_template(messages, { ...opts, tokenize: false });
  const ids = tok.apply_chat_template(messages, { ...opts, tokenize: true, return_tensor: false, return_dict: false });
  console.log(JSON.stringify({ line: i + 1, text, ids: Array.from(ids) }));
}
