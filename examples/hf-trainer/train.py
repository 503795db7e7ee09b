"""A Hugging Face Trainer script adopting rubick's job contract with `rubick.integrations.hf`: a
small GPT-2 *configuration built here* (nothing is downloaded from any hub), trained
on deterministic synthetic token sequences.

    python -m rubick.torchrun --standalone --nproc-per-node 2 train.py --max-steps 50

(`rubick.torchrun`: torchrun that handles the stop signal and exits 0 after a clean
stop; plain torchrun needs --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
and exits 1 on every stop.)

The lines marked `# rubick` are all the contract needed (16 of them).
"""

import argparse
import os
import signal
import sys

try:  # rubick
    import rubick  # rubick
except ImportError:  # not installed: the package of this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # rubick
    import rubick  # rubick
import rubick.integrations.hf  # rubick (fast: it imports transformers only when needed)
rubick.install_exit_hook()  # rubick: an uncaught rubick.PlanError exits 2 (this plan cannot run)

# Before the slow imports: torchrun relays the stop signal, then shuts down with SIGTERM.
callback = rubick.integrations.hf.RubickCallback(stop=rubick.StopFlag(rubick.Plan.from_env().stop_signal, signal.SIGTERM))  # rubick

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """x[t+1] = 5 x[t] + 3 mod vocab from a seeded start, 10 % noise: learnable."""

    def __init__(self, n, seq, vocab, seed=0):
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.empty(self.seq, dtype=torch.long)
        x[0] = torch.randint(self.vocab, (1,), generator=g)
        for t in range(1, self.seq):
            x[t] = (5 * x[t - 1] + 3) % self.vocab
        noise = torch.rand(self.seq, generator=g) < 0.1
        x[noise] = torch.randint(self.vocab, (int(noise.sum()),), generator=g)
        return {"input_ids": x, "labels": x.clone()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=2, vocab_size=256, n_positions=64,
                        n_ctx=64)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    try:  # rubick
        targs = rubick.integrations.hf.training_arguments(max_steps=args.max_steps, learning_rate=1e-3, seed=0)  # rubick
    except rubick.PlanError as e:  # rubick
        print(e, file=sys.stderr)  # rubick
        sys.exit(2)  # rubick
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(100_000, 64, 256), callbacks=[callback])  # rubick
    with rubick.exit_on_oom():  # rubick
        trainer.train(resume_from_checkpoint=rubick.integrations.hf.last_checkpoint(targs.output_dir))  # rubick
    # The Trainer leaves its process group to the interpreter's exit, whose teardown of
    # gloo's threads can abort a rank ("terminate called without an active exception")
    # after a clean stop: every rank leaves it here, together.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
