#!/usr/bin/env node
// Trident from JavaScript: a 1-D random walk trained over trident.v1, built from protos/ alone.
//
//   node walk.mjs [--server HOST:PORT] [--envs N] [--rollout-len T] [--rollouts R] [--token T]
//
// It runs its environments through Interact, assembling each rollout as the server does, then
// holds the server to the contract trainer.proto states: the rollouts re-sent as keyed Steps
// are the same Steps (answered `replayed`, by the Step that applied them), other content under
// a used key is ALREADY_EXISTS, Act answers a valid action per observation at the server's
// version, a Step of Act's rollout applies with a loss for each head that trained, a default checkpoint name is step-<10 digits>, and
// Restore brings back the checkpoint's parameters. Any mismatch exits 1.
import { endianness } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const PROTOS = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "protos");
const { values: args } = parseArgs({
  options: {
    server: { type: "string", default: "127.0.0.1:50051" },
    envs: { type: "string", default: "4" },
    "rollout-len": { type: "string", default: "8" },
    rollouts: { type: "string", default: "3" },
    token: { type: "string", default: process.env.TRIDENT_TOKEN ?? "" },
  },
});
const N = Number(args.envs), T = Number(args["rollout-len"]), ROLLOUTS = Number(args.rollouts);
const EPISODE_STEPS = 5; // the walk is cut short (truncated) after this many steps
const DEADLINE_MS = 60_000;

if (endianness() !== "LE") throw new Error("Tensors are little-endian; this host is not");

// int64 fields as JS numbers (steps and sequences stay far below 2^53); enums by name.
const definition = protoLoader.loadSync("trident/v1/trainer.proto", {
  includeDirs: [PROTOS], keepCase: true, longs: Number, enums: String, defaults: true,
});
const { TrainerService } = grpc.loadPackageDefinition(definition).trident.v1;
const stub = new TrainerService(args.server, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
if (args.token) metadata.set("authorization", `Bearer ${args.token}`);

function call(method, request) {
  const deadline = Date.now() + DEADLINE_MS;
  return new Promise((resolve, reject) =>
    stub[method](request, metadata, { deadline }, (error, reply) =>
      error ? reject(error) : resolve(reply)));
}

function check(ok, what) {
  if (!ok) throw new Error(`contract mismatch: ${what}`);
}

// Tensors: {shape, dtype, raw little-endian bytes}.
const DTYPES = { D_TYPE_FLOAT32: Float32Array, D_TYPE_INT32: Int32Array, D_TYPE_INT64: BigInt64Array,
  D_TYPE_UINT8: Uint8Array };
const dtypeOf = (array) => Object.keys(DTYPES).find((name) => array instanceof DTYPES[name]);
const tensor = (shape, array) =>
  ({ shape, dtype: dtypeOf(array), data: Buffer.from(array.buffer, array.byteOffset, array.byteLength) });
function fromTensor(message, shape) {
  const { data } = message;
  const array = new DTYPES[message.dtype](data.buffer.slice(data.byteOffset, data.byteOffset + data.length));
  check(JSON.stringify(message.shape) === JSON.stringify(shape), `a tensor of shape [${shape}], got [${message.shape}]`);
  return array;
}

// The environment: each of n walkers starts at 0 and moves left (action 0) or right (any other
// action); reaching +3 ends the episode with reward 1 (terminated); after EPISODE_STEPS steps it
// is cut short (truncated). An observation is [x / 3, 1, 0, ...] in D features.
class Walk {
  constructor(n, D) {
    Object.assign(this, { n, D, x: new Int32Array(n), t: new Int32Array(n) });
  }
  observe(i, out, row) {
    out.fill(0, row * this.D, (row + 1) * this.D);
    out[row * this.D] = this.x[i] / 3;
    if (this.D > 1) out[row * this.D + 1] = 1;
  }
  reset() {
    const obs = new Float32Array(this.n * this.D);
    for (let i = 0; i < this.n; i++) this.observe(i, obs, i);
    return obs;
  }
  step(actions) {
    const { n, D } = this;
    const obs = new Float32Array(n * D), rewards = new Float32Array(n);
    const terminated = new Uint8Array(n), truncated = new Uint8Array(n), finals = [];
    for (let i = 0; i < n; i++) {
      this.x[i] += actions[i] === 0 ? -1 : 1;
      this.t[i] += 1;
      terminated[i] = this.x[i] >= 3 ? 1 : 0;
      truncated[i] = !terminated[i] && this.t[i] >= EPISODE_STEPS ? 1 : 0;
      rewards[i] = terminated[i];
      if (truncated[i]) {
        const final = new Float32Array(D);
        this.observe(i, final, 0);
        finals.push([i, final]);
      }
      if (terminated[i] || truncated[i]) this.x[i] = this.t[i] = 0; // auto-reset
      this.observe(i, obs, i);
    }
    return { obs, rewards, terminated, truncated, finals };
  }
}

// One rollout [T, N] as trainer.proto's Interact comment says the server builds it (one group).
class Rollout {
  constructor(D) {
    Object.assign(this, {
      D, obs: new Float32Array((T + 1) * N * D), actions: new Int32Array(T * N),
      logProbs: new Float32Array(T * N), rewards: new Float32Array(T * N),
      terminated: new Uint8Array(T * N), truncated: new Uint8Array(T * N),
      finalObs: [], finalIndex: [], version: null,
    });
  }
  request(key) {
    const { D } = this, M = this.finalIndex.length;
    const finalObs = new Float32Array(M * D);
    this.finalObs.forEach((row, i) => finalObs.set(row, i * D));
    return {
      obs: tensor([T + 1, N, D], this.obs), actions: tensor([T, N], this.actions),
      rewards: tensor([T, N], this.rewards), terminated: tensor([T, N], this.terminated),
      truncated: tensor([T, N], this.truncated), behavior_log_probs: tensor([T, N], this.logProbs),
      final_obs: tensor([M, D], finalObs), final_obs_index: tensor([M], BigInt64Array.from(this.finalIndex)),
      policy_version: this.version, idempotency_key: key,
    };
  }
}

// Interact: per request the walkers' observations (with the outcome of their last actions),
// per response their actions; rollout k is the keyed Step (actor, firstSequence + k).
function interact(D, actor, firstSequence) {
  const env = new Walk(N, D), rollouts = [new Rollout(D)], outcomes = new Map();
  let row = 0, closed = false, obs = env.reset();
  rollouts[0].obs.set(obs, 0);
  return new Promise((resolve, reject) => {
    const stream = stub.Interact(metadata, { deadline: Date.now() + DEADLINE_MS });
    stream.on("error", reject);
    stream.on("end", () => resolve({ rollouts, outcomes }));
    stream.on("data", (reply) => {
      for (const outcome of reply.outcomes) outcomes.set(outcome.sequence, outcome);
      if (reply.group === -1 || closed) return; // the closing response: outcomes only
      const rollout = rollouts.at(-1);
      const actions = fromTensor(reply.actions, [N]), logProbs = fromTensor(reply.log_probs, [N]);
      rollout.actions.set(actions, row * N);
      rollout.logProbs.set(logProbs, row * N);
      rollout.version = Math.min(rollout.version ?? Infinity, reply.policy_version);
      const moved = env.step(actions);
      rollout.rewards.set(moved.rewards, row * N);
      rollout.terminated.set(moved.terminated, row * N);
      rollout.truncated.set(moved.truncated, row * N);
      for (const [i, final] of moved.finals) {
        rollout.finalObs.push(final);
        rollout.finalIndex.push(BigInt(row * N + i));
      }
      row += 1;
      rollout.obs.set(moved.obs, row * N * D);
      const finalObs = new Float32Array(moved.finals.length * D);
      moved.finals.forEach(([, final], m) => finalObs.set(final, m * D));
      stream.write({
        group: 0, obs: tensor([N, D], moved.obs), rewards: tensor([N], moved.rewards),
        terminated: tensor([N], moved.terminated), truncated: tensor([N], moved.truncated),
        final_obs: tensor([moved.finals.length, D], finalObs),
        final_obs_index: tensor([moved.finals.length], Int32Array.from(moved.finals, ([i]) => i)),
      });
      if (row < T) return;
      if (rollouts.length === ROLLOUTS) {
        closed = true; // the next rollout stays unfinished: its actions are not needed
        return stream.end();
      }
      row = 0;
      rollouts.push(new Rollout(D));
      rollouts.at(-1).obs.set(moved.obs, 0); // the closing row opens the next rollout
    });
    stream.write({
      start: { actor_id: actor, first_sequence: firstSequence, rollout_len: T, group_envs: [N] },
      group: 0, obs: tensor([N, D], obs),
    });
  });
}

async function main() {
  const status = await call("GetStatus", {});
  const model = JSON.parse(status.config_json).model;
  const D = model.obs_dim, A = model.num_actions;
  const actor = `js-walk-${process.pid}-${Date.now()}`, first = 100;
  console.log(`server ${args.server}: step ${status.global_step}, obs_dim ${D}, ${A} actions`);

  const { rollouts, outcomes } = await interact(D, actor, first);
  check(outcomes.size === ROLLOUTS, `an outcome for each of ${ROLLOUTS} rollouts, got ${outcomes.size}`);
  let last = status.global_step;
  for (const [k, rollout] of rollouts.entries()) {
    const outcome = outcomes.get(first + k);
    check(outcome?.step, `rollout ${k} trained, got ${outcome?.error_code} ${outcome?.error_message}`);
    check(outcome.step.global_step > last, `rollout ${k} applied by a later Step than rollout ${k - 1}`);
    last = outcome.step.global_step;
    // What a broken stream's actor does: the rollout again, as a keyed unary Step.
    const again = await call("Step", rollout.request({ actor_id: actor, sequence: first + k }));
    check(again.replayed && again.global_step === outcome.step.global_step,
      `rollout ${k} re-sent is the same Step (replayed at ${outcome.step.global_step}), got ` +
      `replayed=${again.replayed} at ${again.global_step}`);
  }
  console.log(`Interact: ${ROLLOUTS} rollouts trained, each the same Step when re-sent`);

  const other = rollouts[0].request({ actor_id: actor, sequence: first });
  other.rewards = tensor([T, N], new Float32Array(T * N).fill(0.5));
  const reused = await call("Step", other).then(() => null, (error) => error);
  check(reused?.code === grpc.status.ALREADY_EXISTS, `other content under a used key is ALREADY_EXISTS, got ${reused?.code}`);

  // Act x T, then Step: an actor rolling out on its own.
  const env = new Walk(N, D), own = new Rollout(D);
  let obs = env.reset();
  own.obs.set(obs, 0);
  for (let t = 0; t < T; t++) {
    const acted = await call("Act", { obs: tensor([N, D], obs), mode: "ACT_MODE_SAMPLE" });
    const actions = fromTensor(acted.actions, [N]);
    check(actions.every((a) => a >= 0 && a < A), `actions in [0, ${A})`);
    check(fromTensor(acted.values, [N]).every(Number.isFinite), "finite values");
    check(acted.policy_version === last, `Act at the server's version ${last}, got ${acted.policy_version}`);
    own.actions.set(actions, t * N);
    own.logProbs.set(fromTensor(acted.log_probs, [N]), t * N);
    own.version = acted.policy_version;
    const moved = env.step(actions);
    for (const [i, final] of moved.finals) {
      own.finalObs.push(final);
      own.finalIndex.push(BigInt(t * N + i));
    }
    own.rewards.set(moved.rewards, t * N);
    own.terminated.set(moved.terminated, t * N);
    own.truncated.set(moved.truncated, t * N);
    obs = moved.obs;
    own.obs.set(obs, (t + 1) * N * D);
  }
  const stepped = await call("Step", own.request({ actor_id: actor, sequence: first + ROLLOUTS + 1 }));
  check(!stepped.replayed && stepped.global_step === last + 1, `Step applied as step ${last + 1}, got ${stepped.global_step}`);
  // The heads that trained have losses: pi and v always, q once the replay holds
  // replay.min_size transitions (this Step's included), bce and aux only with their labels.
  const before = await call("GetStatus", {});
  const minSize = JSON.parse(before.config_json).replay.min_size;
  const heads = ["total", "pi", "v", ...(before.replay_size >= minSize ? ["q"] : [])];
  check(JSON.stringify(Object.keys(stepped.losses).sort()) === JSON.stringify(heads.sort()),
    `losses of ${heads} (replay ${before.replay_size} of replay.min_size ${minSize}), got ` +
    `${Object.keys(stepped.losses)}`);
  check(heads.every((head) => Number.isFinite(stepped.losses[head])), "finite losses");
  console.log(`Act x ${T} then Step: applied as step ${stepped.global_step}, losses ${JSON.stringify(stepped.losses)}`);

  const saved = (await call("Checkpoint", {})).checkpoint;
  check(/^step-\d{10}(-\d+)?$/.test(saved.name), `a default name step-<10-digit step>, got ${saved.name}`);
  check(Number(saved.name.slice(5, 15)) === before.global_step && saved.global_step === before.global_step,
    `checkpoint ${saved.name} at step ${before.global_step}`);
  await call("Step", own.request({ actor_id: actor, sequence: first + ROLLOUTS + 2 }));
  const restored = await call("Restore", { name: saved.name });
  const after = await call("GetStatus", {});
  check(restored.param_digest === before.param_digest && after.param_digest === before.param_digest,
    "Restore brings back the checkpoint's parameters");
  check(after.global_step === saved.global_step, `step ${saved.global_step} after Restore, got ${after.global_step}`);
  console.log(`Checkpoint ${saved.name}, a Step, Restore: back at step ${after.global_step}, same digest`);
  console.log("ok: the server holds the contract");
}

main().then(() => stub.close(), (error) => {
  console.error(`trident-walk: ${error.message ?? error}`);
  stub.close();
  process.exitCode = 1;
});
