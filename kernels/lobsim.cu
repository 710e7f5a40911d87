// LobSim's market step on the GPU: one thread per market runs that market's step serially —
// the agent's (up to two) messages at their latency slot and `events` background events —
// with exactly the integer arithmetic of the NumPy engine (service/lobsim/book.py `Books.apply`,
// service/lobsim/flow.py `background_messages`, the slot loop of service/lobsim/env.py
// `LobSim.step`), so one seed gives bit-identical integer state on both.
// Twin: service/lobsim/env.py's event loop (LobSim.step with backend "numpy").
// Wrapped by service/lobsim/cuda_market.py; any block size (one thread per env).
//
// Layouts (int64 unless noted; N markets, P = TRIDENT_LOB_P prices, D = TRIDENT_LOB_D):
//   lots [2, N, P] background lots (side 0 bid, 1 ask), agent_px / agent_qty / agent_ahead [2, N],
//   inventory, cash, overflow, traded, base [N], limit_w [N, D], cancel_w, market_w,
//   excitation, direction [N]; agent messages: msg [2, 6, N] (kind, side, owner, price, qty,
//   position) for the first and second message; latency [N]; outputs taken, passive, flow [N]
//   (zeroed here).
// Background event i of this step draws Philox counter (env, seq_lo, LOB_FLOW = 6, seq_hi) with
// seq = first_seq + i: word 0 picks the kind, word 1 the size. With informed flow
// (informed_pct > 0) it also draws (env, seq_lo, LOB_INFORMED = 8, seq_hi): word 0 is its
// informed coin (a market order takes side `direction` when ⌊w·100 / 2³²⌋ < informed_pct), and
// event 0's word 1 flips the hidden direction when ⌊w·1000 / 2³²⌋ < flip_permille.
//
// Determinism: no atomics, no shared memory; each thread writes only its market's slots.
#include "common.cuh"

#ifndef TRIDENT_LOB_P
#define TRIDENT_LOB_P 64
#endif
#ifndef TRIDENT_LOB_D
#define TRIDENT_LOB_D 10
#endif

#define LOB_NONE 0
#define LOB_LIMIT 1
#define LOB_CANCEL 2
#define LOB_MARKET 3
#define LOB_AGENT 1

static constexpr unsigned int kLobFlowStream = 6u;      // philox.Stream.LOB_FLOW
static constexpr unsigned int kLobInformedStream = 8u;  // philox.Stream.LOB_INFORMED

// A market's state while its thread steps it. `total`, `background_best` and `lowest` follow
// every write to the rows (lob_set_lots), so an event reads them instead of scanning P prices.
struct LobMarket {
    long long* lots;        // this market's bid row; its ask row is lots + ask_offset
    long long ask_offset;   // N · P
    long long total[2];            // background lots per side
    long long background_best[2];  // best background price per side (-1: none)
    long long lowest[2];           // lowest price with background lots per side (-1: none)
    long long* agent_px;    // [2] through stride N
    long long* agent_qty;
    long long* agent_ahead;
    long long N;
    long long n;
    long long base;
    long long inventory, cash, overflow, traded, taken, passive, flow;
};

static __device__ __forceinline__ long long* lob_row(LobMarket& m, int side)
{
    return m.lots + (side == 0 ? 0 : m.ask_offset);
}
static __device__ __forceinline__ long long& lob_px(LobMarket& m, int side)
{
    return m.agent_px[side * m.N + m.n];
}
static __device__ __forceinline__ long long& lob_qty(LobMarket& m, int side)
{
    return m.agent_qty[side * m.N + m.n];
}
static __device__ __forceinline__ long long& lob_ahead(LobMarket& m, int side)
{
    return m.agent_ahead[side * m.N + m.n];
}

// The first price with background lots on a side from `from` on, going up (step 1) or down
// (step -1); -1: none.
static __device__ long long lob_scan(LobMarket& m, int side, long long from, int step)
{
    const long long* row = lob_row(m, side);
    for (long long p = from; p >= 0 && p < TRIDENT_LOB_P; p += step)
        if (row[p] > 0) return p;
    return -1;
}

// row[price] = lots for one side, keeping `total`, `background_best` and `lowest` exact.
static __device__ void lob_set_lots(LobMarket& m, int side, long long price, long long lots)
{
    long long* row = lob_row(m, side);
    m.total[side] += lots - row[price];
    row[price] = lots;
    const int inward = side == 0 ? -1 : 1;  // from the best price into the book
    long long& best = m.background_best[side];
    long long& lowest = m.lowest[side];
    if (lots > 0) {
        if (best < 0 || (side == 0 ? price > best : price < best)) best = price;
        if (lowest < 0 || price < lowest) lowest = price;
    } else {
        if (price == best) best = lob_scan(m, side, price + inward, inward);
        if (price == lowest) lowest = lob_scan(m, side, price + 1, 1);
    }
}

// Books.best: the best price of a side over background and agent lots (-1: empty).
static __device__ long long lob_best(LobMarket& m, int side)
{
    const long long background = m.background_best[side];
    const long long agent = lob_px(m, side);
    if (side == 0) return background > agent ? background : agent;
    if (background < 0) return agent;
    if (agent < 0) return background;
    return background < agent ? background : agent;
}

// One execution: the agent's account, traded, and the env's taker / passive / flow counters.
static __device__ void lob_fill(LobMarket& m, long long aggressor, long long resting, long long side,
                                long long price, long long qty)
{
    const long long value = qty * (m.base + price);
    const long long signed_qty = side * qty;
    if (aggressor == LOB_AGENT) {
        m.inventory += signed_qty;
        m.cash -= side * value;
        m.taken += qty;
    }
    if (resting == LOB_AGENT) {
        m.inventory -= signed_qty;
        m.cash += side * value;
        m.passive += qty;
    }
    m.traded += qty;
    m.flow += side * qty;
}

// Books._match for one market: returns the lots left unfilled.
static __device__ long long lob_match(LobMarket& m, long long remaining, long long side,
                                      long long owner, long long bound)
{
    const int opp = side == 1 ? 1 : 0;  // a buy meets asks (1), a sell meets bids (0)
    while (remaining > 0) {
        const long long best = lob_best(m, opp);
        const bool crosses = best >= 0 && (side == 1 ? best <= bound : best >= bound);
        if (!crosses) break;
        long long* row = lob_row(m, opp);
        const bool agent_here = lob_px(m, opp) == best;
        long long lots = row[best];
        long long first = agent_here ? lob_ahead(m, opp) : lots;
        first = remaining < first ? remaining : first;
        lots -= first;
        remaining -= first;
        if (agent_here) lob_ahead(m, opp) -= first;
        long long second = 0;
        if (agent_here) {
            second = remaining < lob_qty(m, opp) ? remaining : lob_qty(m, opp);
            remaining -= second;
            lob_qty(m, opp) -= second;
            if (lob_qty(m, opp) == 0) {
                lob_px(m, opp) = -1;
                lob_ahead(m, opp) = 0;
            }
        }
        long long third = 0;
        if (agent_here) {
            third = remaining < lots ? remaining : lots;
            lots -= third;
            remaining -= third;
        }
        lob_set_lots(m, opp, best, lots);
        if (first > 0) lob_fill(m, owner, 0, side, best, first);
        if (second > 0) lob_fill(m, owner, LOB_AGENT, side, best, second);
        if (third > 0) lob_fill(m, owner, 0, side, best, third);
    }
    return remaining;
}

// Books.apply for one message of one market.
static __device__ void lob_apply(LobMarket& m, long long kind, long long side, long long owner,
                                 long long price, long long qty, long long position)
{
    const bool in_window = price >= 0 && price < TRIDENT_LOB_P;
    bool limit = kind == LOB_LIMIT;
    if (limit && !in_window) m.overflow += 1;
    limit = limit && in_window;
    const int own = side == 1 ? 0 : 1;
    if ((kind == LOB_CANCEL && owner == LOB_AGENT) || (limit && owner == LOB_AGENT)) {
        lob_px(m, own) = -1;
        lob_qty(m, own) = 0;
        lob_ahead(m, own) = 0;
    }
    if (kind == LOB_CANCEL && owner != LOB_AGENT && in_window) {
        const long long held = lob_row(m, own)[price];
        long long removed = held - position < qty ? held - position : qty;
        removed = removed > 0 ? removed : 0;
        lob_set_lots(m, own, price, held - removed);
        if (lob_px(m, own) == price) {
            const long long ahead = lob_ahead(m, own);
            const long long end = position + removed < ahead ? position + removed : ahead;
            const long long before = end - position > 0 ? end - position : 0;
            lob_ahead(m, own) = ahead - before;
        }
    }
    if (kind == LOB_MARKET || limit) {
        const long long bound = limit ? price : (side == 1 ? TRIDENT_LOB_P - 1 : 0);
        const long long remaining = lob_match(m, qty, side, owner, bound);
        if (limit && remaining > 0) {
            if (owner == LOB_AGENT) {
                lob_px(m, own) = price;
                lob_qty(m, own) = remaining;
                lob_ahead(m, own) = lob_row(m, own)[price];
            } else {
                lob_set_lots(m, own, price, lob_row(m, own)[price] + remaining);
            }
        }
    }
}

extern "C" __global__ void lobsim_step(
    long long* __restrict__ lots, long long* __restrict__ agent_px,
    long long* __restrict__ agent_qty, long long* __restrict__ agent_ahead,
    long long* __restrict__ inventory, long long* __restrict__ cash,
    long long* __restrict__ overflow, long long* __restrict__ traded,
    const long long* __restrict__ base, const long long* __restrict__ limit_w,
    const long long* __restrict__ cancel_w, const long long* __restrict__ market_w,
    long long* __restrict__ excitation, long long* __restrict__ direction,
    const long long* __restrict__ msg, const long long* __restrict__ latency,
    long long* __restrict__ taken, long long* __restrict__ passive, long long* __restrict__ flow,
    const unsigned int* __restrict__ key, long long first_seq, int events, int max_order_lots,
    int hawkes, long long hawkes_jump, long long hawkes_decay_pct, int informed_pct,
    int flip_permille, long long N)
{
    const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    LobMarket m;
    m.lots = lots + n * TRIDENT_LOB_P;
    m.ask_offset = N * TRIDENT_LOB_P;
    m.agent_px = agent_px;
    m.agent_qty = agent_qty;
    m.agent_ahead = agent_ahead;
    m.N = N;
    m.n = n;
    m.base = base[n];
    m.inventory = inventory[n];
    m.cash = cash[n];
    m.overflow = overflow[n];
    m.traded = traded[n];
    m.taken = m.passive = m.flow = 0;
    for (int side = 0; side < 2; ++side) {
        const long long* row = lob_row(m, side);
        m.total[side] = 0;
        for (int p = 0; p < TRIDENT_LOB_P; ++p) m.total[side] += row[p];
        m.background_best[side] =
            side == 0 ? lob_scan(m, 0, TRIDENT_LOB_P - 1, -1) : lob_scan(m, 1, 0, 1);
        m.lowest[side] = lob_scan(m, side, 0, 1);
    }
    long long limit_weights[TRIDENT_LOB_D];
    long long limit_total = 0;
    for (int d = 0; d < TRIDENT_LOB_D; ++d) {
        limit_weights[d] = limit_w[n * TRIDENT_LOB_D + d];
        limit_total += limit_weights[d];
    }
    long long excite = excitation[n];
    long long hidden = direction[n];  // informed flow's direction: +1 up, -1 down
    const uint2 philox_key = make_uint2(key[0], key[1]);
    for (int slot = 0; slot <= events; ++slot) {
        if (latency[n] == slot) {
            for (int k = 0; k < 2; ++k) {
                const long long* f = msg + (long long)k * 6 * N + n;  // field j at f[j·N]
                lob_apply(m, f[0], f[N], f[2 * N], f[3 * N], f[4 * N], f[5 * N]);
            }
        }
        if (slot == events) break;
        // flow.background_messages for this market
        const unsigned long long seq = (unsigned long long)(first_seq + slot);
        const uint4 w = trident_philox4x32_10(
            make_uint4((unsigned int)n, (unsigned int)(seq & 0xffffffffull), kLobFlowStream,
                       (unsigned int)(seq >> 32)),
            philox_key);
        long long informed_side = 0;  // the side an informed market order takes; 0: uninformed
        if (informed_pct > 0) {
            const uint4 v = trident_philox4x32_10(
                make_uint4((unsigned int)n, (unsigned int)(seq & 0xffffffffull),
                           kLobInformedStream, (unsigned int)(seq >> 32)),
                philox_key);
            // The direction steers background market orders only, so flipping it here, after
            // slot 0's agent messages, is the host's flip at the start of the step.
            if (slot == 0 && trident_below(v.y, 1000u) < (unsigned int)flip_permille)
                hidden = -hidden;
            if (trident_below(v.x, 100u) < (unsigned int)informed_pct) informed_side = hidden;
        }
        const long long bid_total = m.total[0], ask_total = m.total[1];
        const long long* bid_row = lob_row(m, 0);
        const long long* ask_row = lob_row(m, 1);
        const long long market = market_w[n] + excite;
        const long long total = 2 * limit_total + 2 * market + cancel_w[n] * (bid_total + ask_total);
        const long long pick =
            (long long)(((unsigned long long)w.x * (unsigned long long)total) >> 32);
        const long long size =
            1 + (long long)(((unsigned long long)w.y * (unsigned long long)max_order_lots) >> 32);
        long long kind = LOB_CANCEL, side = 1, price = 0, position = 0;
        if (pick < 2 * limit_total) {
            const bool sell = pick >= limit_total;
            const long long offset = sell ? pick - limit_total : pick;
            long long running = 0;
            int distance = 0;
            for (int d = 0; d < TRIDENT_LOB_D; ++d) {
                running += limit_weights[d];
                if (running > offset) { distance = d; break; }
            }
            const long long best_bid = lob_best(m, 0), best_ask = lob_best(m, 1);
            const long long centre = TRIDENT_LOB_P / 2;
            const long long buy_anchor =
                best_ask >= 0 ? best_ask - 1 : (best_bid >= 0 ? best_bid : centre);
            const long long sell_anchor =
                best_bid >= 0 ? best_bid + 1 : (best_ask >= 0 ? best_ask : centre);
            kind = LOB_LIMIT;
            side = sell ? -1 : 1;
            price = sell ? sell_anchor + distance : buy_anchor - distance;
        } else {
            const long long rest = pick - 2 * limit_total;
            if (rest < 2 * market) {
                kind = LOB_MARKET;
                side = rest >= market ? -1 : 1;
                if (informed_side != 0) side = informed_side;
            } else {
                const long long per_lot = cancel_w[n] > 1 ? cancel_w[n] : 1;
                const long long lot = (rest - 2 * market) / per_lot;
                const bool on_ask = lot >= bid_total;
                const long long in_side = on_ask ? lot - bid_total : lot;
                const long long* row = on_ask ? ask_row : bid_row;
                const long long lowest = m.lowest[on_ask ? 1 : 0];
                long long running = 0;
                int level = 0;
                // the levels below `lowest` hold no lots: the scan from 0 would add zeros there
                for (int p = lowest < 0 ? TRIDENT_LOB_P : (int)lowest; p < TRIDENT_LOB_P; ++p) {
                    if (running + row[p] > in_side) { level = p; break; }
                    running += row[p];
                }
                side = on_ask ? -1 : 1;
                price = level;
                position = in_side - running;
            }
        }
        lob_apply(m, kind, side, 0, price, size, position);
        if (hawkes) excite = excite * hawkes_decay_pct / 100 + (kind == LOB_MARKET ? hawkes_jump : 0);
    }
    inventory[n] = m.inventory;
    cash[n] = m.cash;
    overflow[n] = m.overflow;
    traded[n] = m.traded;
    excitation[n] = excite;
    direction[n] = hidden;
    taken[n] = m.taken;
    passive[n] = m.passive;
    flow[n] = m.flow;
}

// Philox words for the environment's own draws (resets, random latencies): out[i] = Philox4x32-10
// of counter (i, seq_lo, stream, seq_hi) under `key`, for i < n — service/backend/philox.py
// `random_bits(key, stream, sequence, n)` bit for bit, so the books reset alike on both.
extern "C" __global__ void lobsim_random_bits(unsigned int key0, unsigned int key1,
                                             unsigned int stream, unsigned long long sequence,
                                             long long n, unsigned int* __restrict__ out)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint4 c = make_uint4((unsigned int)i, (unsigned int)(sequence & 0xffffffffull), stream,
                               (unsigned int)(sequence >> 32));
    trident_philox_store(c, make_uint2(key0, key1), out + 4 * i);
}
