"""Reward-model reward (EasyR1 interface): a Hugging Face sequence-classification model scores
each (prompt, response) conversation; its score is the reward.

    worker:
      reward:
        reward_function: reward_functions/reward_model.py:compute_score
        reward_function_kwargs: {model_path: /models/my-rm, batch_size: 8, normalize: sigmoid}

The conversation is rendered with the reward model's chat template (user: the prompt column's
text, assistant: the response), or as prompt + response when it has none. A one-label model's
logit is the score; with several labels, the softmax probability of `positive_label`.
`normalize: sigmoid` maps a logit into (0, 1). The model loads once per reward process, on CPU
unless `device` says otherwise.
"""

import functools

REWARD_NAME = "reward_model"
REWARD_TYPE = "batch"
REWARD_INPUT_KEYS = ["prompt"]


@functools.lru_cache(maxsize=2)
def _load(model_path: str, device: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(model_path).to(device).eval()
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model


def render(tokenizer, prompt: str, response: str) -> str:
    if tokenizer.chat_template:
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return tokenizer.apply_chat_template(chat, tokenize=False)
    return prompt + response


def compute_score(
    reward_inputs: list[dict],
    model_path: str,
    batch_size: int = 8,
    positive_label: int = 1,
    normalize: str | None = None,
    max_length: int = 4096,
    device: str = "cpu",
) -> list[dict[str, float]]:
    import torch

    tokenizer, model = _load(model_path, device)
    texts = [render(tokenizer, x.get("prompt", ""), x["response"]) for x in reward_inputs]
    scores: list[float] = []
    for i in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[i : i + batch_size],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            add_special_tokens=False,
        ).to(device)
        with torch.no_grad():
            logits = model(**batch).logits.float()
        if logits.shape[-1] == 1:
            values = logits[:, 0]
            values = torch.sigmoid(values) if normalize == "sigmoid" else values
        else:
            values = torch.softmax(logits, dim=-1)[:, positive_label]
        scores += values.tolist()
    return [{"overall": s, "reward_model": s} for s in scores]
