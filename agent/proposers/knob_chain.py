"""The override chain: for each knob, does a change to its literal reach the run, and if not why.

A run's value of a hyper-parameter is set, last one winning, by: the script's literal (a
config-block global, an argparse, typer, click, fire or jsonargparse default, a dataclass
default, a YAML/TOML/JSON key), then a
Python config file the command names and the script exec()s over its globals (nanoGPT's
configurator), then the command's own flags (`--lr=0.1`, `--lr 0.1`, hydra's `model.lr=0.1`),
then the target's `args_file` (appended to the command; editable, so its lines are knobs).
A knob some later layer sets is dead; so is a global assigned again further down, a CLI
option its function assigns again, and a dataclass default every construction of the class
passes explicitly. Attribute-style configs
(`C.trainer.learning_rate = 5e-4`, agent.proposers.knob_attrs) are followed from the script in
the order a run sets them: a default a later key, section or flag sets is dead, and so is a flag
the script sets again after merging the flags. Everything else is live.
Pure: the stdlib and the knob modules. The files given are what is known; a layer whose file
is missing from them cannot be judged (its knobs stay live).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field, replace

from agent.core.config import args_words
from agent.proposers.knob_attrs import Step, covers, flatten, scope_of
from agent.proposers.knob_cli import CLI_KINDS
from agent.proposers.knob_python import ALL, PythonFacts, python_knobs
from agent.proposers.knob_sources import Knob, find_knobs

BARE_FLAGS = ("-m", "--multirun", "--info", "-h", "--help")  # hydra's flags without a value
MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_HYDRA_PATH = re.compile(r"config_path\s*=\s*[\"']([^\"']+)[\"']")
# Settings of the machine or the bookkeeping, not of the model: live, but never searched.
PLUMBING = re.compile(
    r"^(seed|device|devices|gpus|n_gpu|accelerator|num_workers|workers|num_proc|"
    r"preprocessing_num_workers|pin_memory|compile|deterministic|benchmark|verbose|"
    r"log_\w+|\w+_log|logging_\w+|save_\w+|\w+_save_\w*|eval_only|eval_iters|eval_interval|"
    r"eval_steps|always_save_checkpoint|wandb_\w+|local_rank|world_size|port|"
    r"do_train|do_eval|do_predict|overwrite_\w+|train|test|max_iters|max_steps|max_epochs|"
    r"min_epochs|epochs|check_val_every_n_epoch|dataloader_\w+|streaming|"
    r"max_train_samples|max_eval_samples|use_\w*fast\w*|trust_remote_code|\w+_interval|"
    r"_\w+_|"  # hydra's own keys (_partial_, _recursive_)
    # the shape of the data, not a choice: changing it only breaks the run
    r"input_size|output_size|num_classes|n_classes|vocab_size|in_channels|image_size|"
    # sampling after training, not training
    r"top_k|top_p|temperature|num_samples|max_new_tokens|sample_only|"
    r"\w*eval_batch_size)$")  # evaluation speed, not the metric


@dataclass(frozen=True)
class KnobState:
    """One knob and whether a change to it can reach the run (`why` says what wins if not)."""

    knob: Knob
    live: bool
    why: str = ""
    plumbing: bool = False  # a machine or bookkeeping setting (seed, device, ...): not searched

    @property
    def searched(self) -> bool:
        return self.live and not self.plumbing and not isinstance(self.knob.value, str)


@dataclass
class CommandLine:
    """The command split into its script, its positional files and its flags (key -> text)."""

    script: str | None = None
    positionals: list[str] = field(default_factory=list)  # repo-relative paths
    flags: dict[str, str] = field(default_factory=dict)  # "lr" / "model.lr" -> "--lr=0.1"


def takes_value(word: str, nxt: str | None) -> bool:
    """Is `nxt` the value of the flag `word` (`--lr 0.1`, `--overrides n_embd=10,bias=false`)?

    Not when it is a flag itself, nor a hydra override (a dotted key: `model.lr=0.1`), nor
    after hydra's bare flags (`-m`, `--multirun`)."""
    if nxt is None or nxt.startswith("-") or word in BARE_FLAGS:
        return False
    return "=" not in nxt or "." not in nxt.split("=", 1)[0]


def flag_key(word: str) -> str:
    """`--n-layer` and `--n_layer` -> `n_layer`; `+model.lr` -> `model.lr`."""
    return word.lstrip("-+").replace("-", "_") if word.startswith("-") else word.lstrip("+")


def script_word(words: list[str]) -> tuple[int, str] | None:
    """(index of the last word naming the script, its path): `train.py`, or the module of
    `python -m pkg.train` as `pkg/train.py`."""
    for i, word in enumerate(words):
        if word.endswith(".py"):
            return i, word
        if word == "-m" and 0 < i < len(words) - 1 and MODULE.fullmatch(words[i + 1]) and \
                posixpath.basename(words[0]).startswith("python"):
            return i + 1, words[i + 1].replace(".", "/") + ".py"
    return None


def parse_words(words: list[str], workdir: str = ".") -> CommandLine:
    """Which script a command runs, the files it names after it, and the flags it sets."""
    line = CommandLine()
    found = script_word(words)
    if found is not None:
        line.script = posixpath.normpath(posixpath.join(workdir, found[1]))
    rest = words[found[0] + 1:] if found else []
    j = 0
    while j < len(rest):
        word = rest[j]
        if word.startswith("-") and "=" in word:
            line.flags[flag_key(word.split("=", 1)[0])] = word
        elif word.startswith("-") and len(word) > 1 and not word[1].isdigit():
            nxt = rest[j + 1] if j + 1 < len(rest) else None
            if takes_value(word, nxt):
                line.flags[flag_key(word)] = f"{word} {nxt}"
                j += 1
            else:
                line.flags[flag_key(word)] = word
        elif "=" in word:
            line.flags[flag_key(word.split("=", 1)[0])] = word
        else:
            line.positionals.append(posixpath.normpath(posixpath.join(workdir, word)))
        j += 1
    return line


def _facts(files: dict[str, str]) -> tuple[dict[str, list[Knob]], dict[str, PythonFacts]]:
    first = {p: python_knobs(p, t)[1] for p, t in files.items() if p.endswith(".py")}
    classes = {c for f in first.values() for c in f.fields}
    known = frozenset(q for f in first.values() for q in f.attrs.scopes if q)
    getters = frozenset(g for f in first.values() for g in f.attrs.getters)
    knobs: dict[str, list[Knob]] = {}
    facts: dict[str, PythonFacts] = {}
    for path, text in files.items():
        if path.endswith(".py"):
            knobs[path], facts[path] = python_knobs(path, text, classes, known, getters)
        else:
            knobs[path] = find_knobs(path, text)
    return knobs, facts


@dataclass
class _Chain:
    files: dict[str, str]
    command: CommandLine
    args: CommandLine  # the args_file's words, parsed as if they followed the command
    args_file: str | None
    knobs: dict[str, list[Knob]]
    facts: dict[str, PythonFacts]
    steps: list[Step] = field(default_factory=list)  # attribute configs, as the run sets them
    placed: dict[tuple[str, int, int], tuple[int, str]] = field(default_factory=dict)

    def place_attrs(self) -> None:
        """Each attribute knob the script reaches: its step and its full key."""
        for i, step in enumerate(self.steps):
            for knob in step.event.knobs:
                full = step.key + knob.name[len(step.event.key):]
                self.placed.setdefault((knob.path, knob.line_no, knob.col), (i, full))

    def full_name(self, knob: Knob) -> str:
        found = self.placed.get((knob.path, knob.line_no, knob.col))
        return found[1] if found else knob.name

    def attr_setter(self, knob: Knob) -> str | None:
        """A later key set, a section replaced, or a flag merged after it."""
        found = self.placed.get((knob.path, knob.line_no, knob.col))
        if found is None and any(s.path == knob.path for s in self.steps):
            # the script's config reaches this file, not this function
            scope = scope_of(self.facts[knob.path].attrs, knob) or f"{knob.path}'s module code"
            return f"{scope} sets it, and nothing the script runs reaches {scope}"
        if found is None:  # a file the script's code does not reach: its flags, if any
            key = _flag_form(knob.name)
            return self.flag_setter([key, f"config.{key}"])
        at, full = found
        for step in self.steps[at + 1:]:
            if step.sure and step.event.kind in ("set", "mount", "reset") and \
                    covers(step.key, full):
                value = f": {step.key} = {step.event.knobs[0].raw}" if \
                    len(step.event.knobs) == 1 else ""
                return f"set again at {step.path}:{step.event.line + 1}{value}"
        merges = [i for i, s in enumerate(self.steps) if s.event.kind == "flags"]
        if not merges or merges[-1] > at:
            return self.flag_setter([_flag_form(full)])
        return None

    def after_flags(self, key: str) -> str | None:
        """A flag the script overwrites after merging the flags (`config.model.x = ...`)."""
        merges = [i for i, s in enumerate(self.steps) if s.event.kind == "flags"]
        if not merges:
            return None
        later = [s for s in self.steps[merges[-1] + 1:] if s.sure and
                 s.event.kind in ("set", "mount", "reset") and covers(s.key, key)]
        return (f"{later[0].path}:{later[0].event.line + 1} sets {later[0].key} after the flags "
                "are merged") if later else None

    def flag_setter(self, keys: list[str]) -> str | None:
        for key in keys:
            if key in self.args.flags:
                return f"{self.args_file} sets {self.args.flags[key]} (that line is the knob)"
        for key in keys:
            if key in self.command.flags:
                return (f"the command sets {self.command.flags[key]}: a change here cannot reach "
                        "the run (move that flag into args_file to search it)")
        return None

    def config_files(self) -> list[str]:
        return [p for p in [*self.command.positionals, *self.args.positionals] if p.endswith(".py")]

    def global_setter(self, knob: Knob) -> str | None:
        facts = self.facts.get(knob.path)
        if facts and knob.name in facts.reassigned:
            return f"set again at {knob.path}:{facts.reassigned[knob.name] + 1}"
        script = self.command.script
        configs = self.config_files()
        execs = script is not None and self.facts.get(script, PythonFacts()).execs_over_globals
        if not execs or knob.path not in (script, *configs):
            return None
        later = configs if knob.path == script else configs[configs.index(knob.path) + 1:]
        for path in later:
            hit = next((k for k in self.knobs.get(path, []) if k.name == knob.name), None)
            if hit is not None:
                return f"{hit.where} sets it again (the command runs {path} after the script)"
        return self.flag_setter([knob.name])

    def dataclass_setter(self, knob: Knob) -> str | None:
        cls, name = knob.name.split(".", 1)
        if any(cls in f.parsed_from_cli for f in self.facts.values()):
            for path in (p for p in self.command.positionals if p.endswith(".json")):
                if name in _json_keys(self.files.get(path)):
                    return f"{path} sets {name} (the script parses that file into {cls})"
            return self.flag_setter([name])
        calls = [c for f in self.facts.values() for c in f.constructions.get(cls, [])]
        order = next((f.fields[cls] for f in self.facts.values() if cls in f.fields), [])
        index = f"#{order.index(name)}" if name in order else ""
        if calls and all(name in c or ALL <= c or index in c for c in calls):
            calls_text = "the one call" if len(calls) == 1 else f"all {len(calls)} calls"
            return (f"every {cls}(...) call passes {name} explicitly ({calls_text}): its default "
                    "is never used")
        return None

    def option_setter(self, knob: Knob) -> str | None:
        """A CLI option: its function sets it again, else a flag of args_file or the command."""
        again = self.facts.get(knob.path, PythonFacts()).set_again.get((knob.line_no, knob.col))
        if again is not None:
            return (f"set again at {knob.path}:{again + 1}: the function overwrites its "
                    f"{knob.flag} before using it")
        return self.flag_setter([flag_key(f) for f in knob.flags or (knob.flag,)])

    def config_key_setter(self, knob: Knob) -> str | None:
        prefix = self.hydra_prefix(knob.path)
        return None if prefix is None else self.flag_setter([prefix + knob.name])

    def hydra_prefix(self, path: str) -> str | None:
        text = self.files.get(self.command.script or "", "")
        m = _HYDRA_PATH.search(text)
        if not m or not path.endswith((".yaml", ".yml")) or self.command.script is None:
            return None
        root = posixpath.normpath(posixpath.join(posixpath.dirname(self.command.script),
                                                 m.group(1)))
        rel = posixpath.relpath(path, root)
        if rel.startswith(".."):
            return None
        if "@package _global_" in self.files.get(path, ""):
            return ""
        group = posixpath.dirname(rel)
        return "" if group in ("", ".") else group.replace("/", ".") + "."

    def args_setter(self, knob: Knob) -> str | None:
        key = flag_key(knob.name)
        later = [k for k in self.knobs.get(knob.path, [])
                 if flag_key(k.name) == key and k.line_no > knob.line_no]
        return f"{later[-1].where} sets it again" if later else self.after_flags(key)

    def why_dead(self, knob: Knob) -> str | None:
        if knob.kind == "args":
            return self.args_setter(knob)
        if knob.kind in ("constant", "global"):
            return self.global_setter(knob)
        if knob.kind == "argparse" or knob.kind in CLI_KINDS:
            return self.option_setter(knob)
        if knob.kind == "dataclass":
            return self.dataclass_setter(knob)
        if knob.kind == "attr":
            return self.attr_setter(knob)
        return self.config_key_setter(knob)


def _flag_form(key: str) -> str:
    """The key a flag sets for a knob: `trainer.betas` for the element `trainer.betas[1]`."""
    return re.sub(r"\[\d+\]$", "", key)


def _json_keys(text: str | None) -> set[str]:
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return set()
    return set(data) if isinstance(data, dict) else set()


def resolve(files: dict[str, str], command: str, args_file: str | None = None,
            workdir: str = ".") -> list[KnobState]:
    """Every knob of `files` (path -> text: the editable files, and any others known) with
    whether it is live. `args_file`, when given and in `files`, holds extra arguments."""
    words = shlex.split(command)
    cmd = parse_words(words, workdir)
    args_text = files.get(args_file or "") if args_file else None
    at = script_word(words)
    extra = parse_words(words[:1 + at[0]] + args_words(args_text), workdir) \
        if args_text and at is not None else CommandLine()
    knobs, facts = _facts({p: t for p, t in files.items() if p != args_file})
    if args_file and args_text is not None:
        knobs[args_file] = find_knobs(args_file, args_text, args_file=args_file)
    steps = flatten({p: f.attrs for p, f in facts.items()}, cmd.script)
    chain = _Chain(files, cmd, extra, args_file, knobs, facts, steps)
    chain.place_attrs()
    states = []
    for path in sorted(knobs):
        for knob in knobs[path]:
            why = chain.why_dead(knob)
            if knob.kind == "attr":
                knob = replace(knob, name=chain.full_name(knob))
            key = flag_key(knob.name).rsplit(".", 1)[-1].lower()
            states.append(KnobState(knob, why is None, why or "", bool(PLUMBING.match(key))))
    return states
