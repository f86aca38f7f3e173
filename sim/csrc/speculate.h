/* Speculative decoding's acceptance draws for the compiled core (core.c): sim/speculative.py
Speculation.accept, on the same stream.

The stream is CPython's ``random.Random`` (MT19937): the core is handed the state of the Speculation's own
generator (``getstate()``: 624 words and the position) and draws from it exactly what ``random()`` would
(two 32-bit outputs, 53 bits), so a run in the core and in the SimPy loop accept the same drafts. The
state goes back at the end. Invariants: ``pos`` in 0..624; ``survival`` non-increasing, P(a >= j) at
``survival[j - 1]``. */
#ifndef KVSIM_SPECULATE_H
#define KVSIM_SPECULATE_H

#include <stdint.h>

#define SPEC_MT_WORDS 624
#define SPEC_MAX_DRAFTS 16

typedef struct {
    int64_t k;                            /* num_speculative_tokens (0: no speculation) */
    double survival[SPEC_MAX_DRAFTS];
    int64_t verifications, drafted, accepted;
    int pos;
    uint32_t mt[SPEC_MT_WORDS];
} Speculate;

/* random.Random.random() of the state */
double speculate_random(Speculate *s);
/* Speculation.accept: the leading drafts of ``drafts`` the target accepts (one draw), counted */
int64_t speculate_accept(Speculate *s, int64_t drafts);

#endif
