"""Reward model: Bradley-Terry on whole-trajectory comparisons, through TRL's `RewardTrainer`.

Any causal-LM or encoder directory gets a one-output sequence-classification head
(``AutoModelForSequenceClassification``, ``num_labels=1``) and learns r(prompt, completion) so that
P(chosen > rejected) = sigmoid(r_chosen - r_rejected). It trains on Tandem's `preference` export: conversational rows
(message lists, rendered with the tokenizer's chat template and the row's ``tools``, or as the ``Role: content``
transcript when it has none) or `text` rows (prompt + completion strings). The model reads what it was trained on:
scoring a conversation with a model trained on text rows reads its transcript (`turns.text_pair`), and a model
trained on conversations refuses text.

- Strength is a margin: with `use_margin` the row's ``margin`` column (0 / 0.5 / 1 for slight / clear / decisive)
  asks for r_chosen - r_rejected > margin, TRL's margin loss.
- Ties (rows with ``tie: true``, whose chosen/rejected order means nothing) are dropped (``ties="drop"``) or train
  with ``ties="tie_loss"``: the Bradley-Terry cross-entropy with the soft target 1/2,
  -1/2 log sigmoid(d) - 1/2 log sigmoid(-d), which is smallest at d = 0. We use it rather than Rao-Kupper because
  it keeps the one model every other label uses: P(a > b) stays sigmoid(r_a - r_b), so the probabilities that
  active selection, evaluation and the policy trainers read mean the same with or without ties. Rao-Kupper adds a
  learned threshold and a third outcome that every consumer would have to carry.
- Ensembles: `ensemble_size` K members, each from its own seed (head initialisation and batch order), or with
  ``ensemble_mode="bootstrap"`` each on a resample with replacement of the training pairs. The spread of the members'
  scores is the uncertainty that active query selection uses. Bradley-Terry fixes rewards only up to a constant, so
  each member of an ensemble is centred on its mean reward over a sample of its training completions; otherwise the
  spread would mostly measure offsets. A single model is not centred (its differences are all that count).
- Evaluation on held-out tasks (`split_by_task`): pairwise accuracy, log-loss and expected calibration error of the
  ensemble's P(chosen > rejected), overall and by the rows' ``pair_type``, beside the "shorter trajectory wins"
  baseline; tie rows are reported apart as their mean |P - 1/2|.

The run directory::

    output_dir/tandem_artifact.json      manifest: config, metrics, summary, members
    output_dir/members/<i>/              member i: an ordinary HF directory (safetensors, config, tokenizer)
                                         and tandem_member.json (seed, centring offset, what it trained on)
    output_dir/checkpoints/checkpoint-N  the member in training, for resume; removed when it is saved

A run called again on the same directory skips finished members and resumes the current one from its last
checkpoint; a finished directory returns its stored summary.

Defaults suit a tiny model on a CPU. For a 0.5-8B model on a GPU::

    python -m reward_models.reward --data_path preference.jsonl --base_model Qwen/Qwen2.5-0.5B-Instruct \\
        --output_dir var/models/rm --precision bf16 --learning_rate 1e-5 --batch_size 4 \\
        --gradient_accumulation_steps 8 --gradient_checkpointing true --max_length 4096 --num_epochs 1
    # 7-8B: add --use_lora true --lora_r 16 --learning_rate 1e-4 (the LoRA weights are merged into the saved model)
    # several GPUs: accelerate launch -m reward_models.reward ...

The package: `config` (the settings and the run directory's layout), `encoding` (what the model reads, as token
ids), `model` (the loaded model or ensemble: scoring and held-out evaluation), `metrics` (the pairwise figures),
`train` (the pipeline: row checks, members, `main`) and `trainer` (TRL's `RewardTrainer` with the tie loss, imported
only when a member trains).

Example::

    from reward_models.reward.config import RewardConfig
    from reward_models.reward.model import load_reward_model
    from reward_models.reward.train import main

    summary = main(RewardConfig(data_path="pref.jsonl", base_model="var/policies/bootstrap", output_dir="var/rm"))
    model = load_reward_model("var/rm")
    mean, std = model.score([prompt], [completion])
    p, p_std = model.preference_probability(prompt, completion_a, completion_b)
"""
