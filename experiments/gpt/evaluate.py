"""Score a finished training again: the target's eval_command. PROTECTED.

The service runs this, in the run's worktree, when train.py's evaluation crashed after training
had finished and saved its checkpoint ($OVERNIGHT_CHECKPOINT_DIR/model.pt). It builds train.py's
model (`GPT()`, with the hyper-parameters of this commit), loads the saved weights, scores them
with prepare.evaluate_bpb (in small batches when OVERNIGHT_EVAL_RETRY is set: the score does not
depend on the batch size, the memory does) and prints the summary block.
"""

import os

import train
from prepare import EVAL_BATCH_SIZE, evaluate_bpb, load_checkpoint

RETRY_BATCH_SIZE = 4  # windows per forward pass on a re-run (an eighth of the memory)


def main():
    saved = load_checkpoint()
    device = train.pick_device()
    model = train.GPT().to(device)
    model.load_state_dict(saved["state_dict"])
    retry = bool(os.environ.get("OVERNIGHT_EVAL_RETRY"))
    batch = RETRY_BATCH_SIZE if retry else EVAL_BATCH_SIZE
    print(f"evaluating the saved model on {device} in batches of {batch}", flush=True)
    val_bpb = evaluate_bpb(model, device, batch_size=batch)
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    for key, value in saved["summary"].items():
        print(f"{key + ':':<18s}{value}")


if __name__ == "__main__":
    main()
