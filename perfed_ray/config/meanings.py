"""What each core key means, in the words `perfed-ray keys`, the docs' configuration
reference and the runs table's readers see.

The prose is kept apart from :mod:`perfed_ray.config.schema` so that the record of a
run's choices reads as types, defaults and bounds on one screen; every core key must
have its line here (the schema looks each up as it loads), so none goes undocumented.
"""

MEANINGS: dict[str, str] = {
    "dataset": (
        "data set (synthetic: FedProx's Synthetic(alpha, beta); leaf: users' own files "
        "in data_folder)"
    ),
    "data_root": (
        "folder holding the data sets; `auto` means $PERFED_DATA, else ~/.cache/perfed-ray/data"
    ),
    "data_folder": (
        "folder of the users' own files for dataset leaf (LEAF's train/ and test/ of "
        ".json, or one .npz per user), absolute or relative to data_root"
    ),
    "download": "download the data set through torchvision when it is missing",
    "data_transport": (
        "how actors get the data: one read-only copy in Ray's object "
        "store, or each actor reads the data root itself"
    ),
    "partition": (
        "how the data are split among users (`natural`: the data set's own users, for "
        "synthetic and leaf)"
    ),
    "paper_a": (
        "`a` of the paper split (images per class unit); auto: 196 for MNIST, "
        "68 for CIFAR-10, 40 for gaussian"
    ),
    "input_scale": (
        "how pixels become inputs: unit [0, 1] (docs/PROTOCOL.md), standardize (per-channel "
        "mean and standard deviation of the whole training set, the same for every user), "
        "standardize-pixel (the same per pixel), imagenet (RGB standardised by ImageNet's "
        "channel means and deviations, as FedRep's CIFAR code does), raw (0-255)"
    ),
    "augment": (
        "training-time augmentation of image batches: none, or crop-flip (a random crop "
        "of the image's size from it padded by 4 black pixels, then a random left-right "
        "flip, as FedRep's and LG-FedAvg's CIFAR code do); test images are never augmented"
    ),
    "synthetic_alpha": "alpha of Synthetic(alpha, beta): how much users' models differ",
    "synthetic_beta": "beta of Synthetic(alpha, beta): how much users' inputs differ",
    "dirichlet_alpha": "concentration of the `dirichlet` partition",
    "labels_per_user": "classes per user of the `labels` partition, shards per user of `shards`",
    "n_users": "number of users n (the driver keeps a few numbers per user, so at most 10^8)",
    "fraction": "fraction r of users sampled per round",
    "tau": "local steps per round (unless local_epochs)",
    "local_epochs": (
        "local work in epochs instead of tau steps: each user passes over its own training "
        "shard this many times in batches of batch_size, so users of different sizes take "
        "different numbers of steps; off: tau steps"
    ),
    "rounds": "communication rounds K",
    "alpha": "step size of the inner (adaptation) step",
    "beta": "local (outer) step size",
    "batch_size": (
        "size of each batch D, D', D'' (a small user's batch is filled up to it from "
        "its own samples, so at most 10^6)"
    ),
    "delta": "finite-difference step of Per-FedAvg (HF)",
    "hf_delta": (
        "Per-FedAvg (HF)'s difference step: fixed (`delta`) or normalized "
        "(`delta / ‖g‖`: the perturbation of w has length `delta`)"
    ),
    "algorithm": (
        "federated algorithm (see perfed_ray/algorithms; a user's own as package.module:Class)"
    ),
    "model": (
        "model: the paper's MLP (80, 60, ELU), a small CNN, FedRep's authors' CIFAR CNN "
        "(lenet), pfl-research's CIFAR-10 CNN with dropout (simple_cnn) or multinomial "
        "logistic regression (logreg)"
    ),
    "seed": "seed of everything random in the run",
    "eval_every": "evaluate users every this many rounds (and at the end)",
    "eval_from": (
        "intermediate evaluations start at this round (round 0 and the end are always "
        "scored): a long run read at its last rounds only, as FedRep's authors average "
        "their last 10"
    ),
    "eval_users": (
        "users scored at the intermediate evaluations: all, a number of users (an integer "
        ">= 1), or a fraction of them (below 1), drawn afresh from each evaluation's own "
        "stream; the final evaluation scores everyone unless sample_final_eval"
    ),
    "shard_cache_mb": (
        "megabytes of users' shards an actor keeps made (most recently used first); "
        "others are made again from their indices or seed when next needed. all: keep "
        "every shard once made. Results do not depend on it"
    ),
    "sample_final_eval": "the final evaluation, too, scores only eval_users users",
    "final_eval_draws": "independent adaptation batches drawn at the final evaluation",
    "personalise_steps": (
        "personalisation steps at evaluation: scores after 0, 1, ..., k steps (acc_steps, "
        "loss_steps); acc_after is after k (docs/PROTOCOL.md: 1)"
    ),
    "unseen_users": (
        "share of users (drawn from the seed) never sampled for training and evaluated "
        "like the others, marked `unseen` in evals: the paper's new users"
    ),
    "validation": (
        "share of each user's training samples (drawn from the seed) held out from "
        "training and scored instead of its test shard: step sizes chosen on it (`perfed-ray "
        "sweep`'s search) never see test data; 0 scores the test shard"
    ),
    "adapt_on": (
        "shard the evaluation's adaptation batch comes from (`test` leaks "
        "labels: the paper's FedAvg baseline text; report it separately)"
    ),
    "users_per_actor": (
        "users hosted by each Ray actor; auto: one actor per user while the cluster "
        "runs every user's actor at once, else as many actors as it runs at once, users "
        "spread evenly over them"
    ),
    "engine": (
        "how an actor runs its users' local work: sequential (one after another), "
        "vmap (torch.func.vmap, any model), fused (stacked parameters and batched matrix "
        "products, for models that declare fused_layers()), grouped (users as groups of "
        "grouped convolutions, for models that declare grouped_layers()); auto: fused "
        "where the model allows, else the fastest measured on the actors' device (cached "
        "in ~/.cache/perfed-ray/engines.json, or $PERFED_ENGINE_CACHE)"
    ),
    "balance_rounds": (
        "spread each round's users evenly (by their local steps) over the actors, "
        "moving as few from their hosts as that takes (a per-user state goes with its "
        "user and back), so no actor waits for a busier one; auto: on with two or more "
        "actors"
    ),
    "compile": (
        "torch.compile the fused engine's local step (about 10-20 s per actor the "
        "first time, kernels cached for the next runs); auto: on when each actor has more "
        "than 200,000 user-steps to run"
    ),
    "trained_users": (
        "who trains in a round: the sampled users (Algorithm 1), or every user while only "
        "the sampled ones are aggregated (pFedMe's and local training's authors' code)"
    ),
    "sampling": (
        "how a round's users are drawn: uniformly, or in proportion to their training "
        "samples (Ditto's and FedProx's authors' code), fraction * n_users of them without "
        "replacement; or poisson: each user on its own with probability fraction, so "
        "cohorts vary (what differential privacy's accounting by subsampling assumes)"
    ),
    "client_optimizer": (
        "the optimiser of the local steps of methods that use one (its settings in its "
        "own section, e.g. sgd: {momentum: 0.5}); Per-FedAvg's steps are the paper's SGD"
    ),
    "server_optimizer": (
        "how the server moves its model towards the users' aggregate: mean (Algorithm 1: "
        "the aggregate itself), or an optimiser on the pseudo-gradient (FedAvgM, FedAdam ...)"
    ),
    "strategy": (
        "the server's policy: which users a round samples and which are "
        "evaluated (uniform: Algorithm 1's, without replacement)"
    ),
    "privacy": (
        "user-level differential privacy: none, central (DP-FedAvg: users' updates "
        "clipped, Gaussian noise on their sum at the server) or local (each user noises "
        "its own update); its settings in the privacy section (privacy.epsilon ...)"
    ),
    "devices": (
        "users' devices on the simulated clock, how fast each computes and communicates: "
        "equal (every user devices.compute_ms and devices.bandwidth_kbps), lognormal "
        "(each user's drawn once around them) or table (devices.file)"
    ),
    "availability": (
        "when users are online on the simulated clock: always, diurnal (each user a "
        "window of availability.online of every day) or table (availability.file's "
        "intervals, repeating every availability.period seconds)"
    ),
    "aggregation": (
        "how users' models are combined: their plain mean (Algorithm 1) or their "
        "mean weighted by training samples"
    ),
    "num_cpus_per_actor": (
        "CPUs each actor asks Ray for; auto: the cluster's CPUs shared among the actors, at most 1"
    ),
    "num_gpus_per_actor": (
        "GPUs each actor asks Ray for (fractions allowed); auto: the cluster's GPUs "
        "shared among the actors, at most 1, or 0 without GPUs (at most 4 actors a GPU)"
    ),
    "checkpoint_every": (
        "write a checkpoint (global model, round, result file counts) every this many "
        "rounds and at the end; `--resume` continues from the last one"
    ),
    "actor_retries": (
        "times one actor may die in one round (and be replaced, its users' work re-run; "
        "with per-user state, every actor rolled back to the last checkpoint) before the "
        "run stops"
    ),
    "dropout": (
        "chance that a sampled user drops out of a round (does not report); simulates "
        "partial participation, recorded in `events`"
    ),
    "stragglers": (
        "chance that a sampled user that did not drop out reports after the round's "
        "deadline and is cut; recorded in `events` (a draw, beside the simulated clock: "
        "`deadline` cuts by the users' devices instead)"
    ),
    "overcommit": (
        "a synchronous round samples ceil(overcommit * cohort) online users and keeps the "
        "first cohort to finish on the simulated clock (FedScale's over-commitment); the "
        "rest are `late` in the tasks table"
    ),
    "deadline": (
        "simulated seconds a task may take (download, local work, upload) before it is "
        "`late` and cut; off: none"
    ),
    "tag": "free-form label stored with the results",
    "report_to": (
        "trackers that also receive the run as it goes (docs/guide/tracking.md): "
        "tensorboard, mlflow, wandb, or your own; e.g. --set report_to=[tensorboard,mlflow]. "
        "The Parquet tables stay the record"
    ),
    "report_every": (
        "send report_to's trackers every this many rounds' rows (and every evaluation's "
        "round); 1: every round. A tracker's cost is per value logged (docs/guide/tracking.md: "
        "What they cost); the Parquet tables keep every round"
    ),
    "tensorboard_dir": (
        "folder of report_to: tensorboard's event files, each run in a folder named after "
        "it (a sweep's trials inside one named after the sweep); auto: the results "
        "folder's tensorboard/"
    ),
}
