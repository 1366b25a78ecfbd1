#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/tokenizer/: a tiny UMT5-style sentencepiece model and what
transformers' tokenizer makes of a set of prompts after diffusers' WanPipeline prompt cleaning,
the reference for tessel's UMT5 tokenizer.

Needs sentencepiece, transformers and ftfy (pip):
    python3 scripts/make_tokenizer_fixture.py [--out tests/fixtures/diffusion/tokenizer]

Writes spiece.model (a unigram model of 360 pieces trained on a fixed synthetic corpus, with T5's
special ids: pad 0, eos 1, unk 2, and byte fallback as UMT5's model has), tokenizer_config.json,
and cases.json: for each prompt the cleaned text, max_length, and the input_ids and attention_mask
that AutoTokenizer (what WanPipeline loads) returns with padding="max_length", truncation=True,
add_special_tokens=True.
"""
import argparse
import html
import io
import json
import os
import random
import re

import ftfy
import sentencepiece as spm
from transformers import AutoTokenizer


# diffusers' pipeline_wan.py prompt cleaning (basic_clean, whitespace_clean, prompt_clean).
def basic_clean(text):
    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text))
    return text.strip()


def whitespace_clean(text):
    text = re.sub(r"\s+", " ", text)
    return text.strip()


def prompt_clean(text):
    return whitespace_clean(basic_clean(text))


def train_model():
    rng = random.Random(0)
    words = ("a cat dog runs jumps over the lazy quick brown fox in sunny park city night neon lights video "
             "cinematic shot of woman man walking street rain camera pans slowly close up portrait beautiful "
             "landscape mountains river ocean waves sunset golden hour 4k detailed").split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(2000)]
    lines += ["Café naïve résumé über straße", "東京の夜 猫が走る", "hello, world! It's 3 o'clock.", "\"quoted\" 'single'"] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=360,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   byte_fallback=True, character_coverage=1.0, num_threads=1, minloglevel=2)
    return model.getvalue()


LONG_PROMPT = " ".join(["a quick brown fox jumps over the lazy dog in the golden hour light"] * 60)

PROMPTS = [
    ("plain", "A cat walks on the grass, realistic style.", 512),
    ("empty (the default negative prompt)", "", 512),
    ("whitespace only", " \t\n ", 512),
    ("whitespace runs", "  Café   naïve\t\tüber\n\nstraße  ", 512),
    ("unicode whitespace", "night\u00a0city\u3000neon\u2003lights\u2028rain", 512),
    ("cjk, emoji, fullwidth, ligature", "東京の夜 猫が走る 😀🎬 ＡＢＣ ﬁne", 512),
    ("combining accent", "cafe\u0301 re\u0301sume\u0301", 512),
    ("curly quotes", "“quoted” ‘single’ don’t", 512),
    ("html entities, escaped twice", "Tom &amp; Jerry &quot;run&quot; &#39;fast&#39; &#x41; &lt;3 &amp;amp; &copy;", 512),
    ("html edge cases", "&amp &ampx &#150; &#x110000; &#0; &#xD800; &#65 &hellip; &EACUTE; &#1; &#xfffe; &bogus; &#;", 512),
    ("a line with '<' is not unescaped by ftfy", "a < b &amp;amp;amp; c\nnext line &amp;amp;amp;", 512),
    ("terminal escapes and c1 controls", "\x1b[31mred\x1b[0m \x93quote\x94 \x80", 512),
    ("control characters", "a\x00b\x07c\x1bd\x7fe\ufefff", 512),
    ("long prompt cut at 512", LONG_PROMPT, 512),
    ("cut at a short max_length", "a quick brown fox jumps over the lazy dog", 8),
    ("exactly max_length with eos", "a cat", 4),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/diffusion/tokenizer")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "spiece.model"), "wb") as f:
        f.write(train_model())
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "eos_token": "</s>", "pad_token": "<pad>",
                   "unk_token": "<unk>", "model_max_length": 512}, f, indent=1)
    tokenizer = AutoTokenizer.from_pretrained(args.out)
    cases = []
    for name, prompt, max_length in PROMPTS:
        cleaned = prompt_clean(prompt)
        encoded = tokenizer([cleaned], padding="max_length", max_length=max_length, truncation=True,
                            add_special_tokens=True, return_attention_mask=True)
        cases.append({"name": name, "prompt": prompt, "cleaned": cleaned, "max_length": max_length,
                      "input_ids": encoded["input_ids"][0], "attention_mask": encoded["attention_mask"][0]})
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")


if __name__ == "__main__":
    main()
