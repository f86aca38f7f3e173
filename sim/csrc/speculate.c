/* Speculative decoding's acceptance draws (speculate.h): CPython's MT19937 (Modules/_randommodule.c,
genrand_uint32 and random_random) over a state handed over from Python. */
#include "speculate.h"

enum { MT_SHIFT = 397 };

static const uint32_t MATRIX_A = 0x9908b0dfu, UPPER_MASK = 0x80000000u, LOWER_MASK = 0x7fffffffu;

static uint32_t next_word(Speculate *s)
{
    uint32_t *mt = s->mt, y;
    if (s->pos >= SPEC_MT_WORDS) {   /* the next 624 words at once */
        int kk;
        for (kk = 0; kk < SPEC_MT_WORDS - MT_SHIFT; kk++) {
            y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
            mt[kk] = mt[kk + MT_SHIFT] ^ (y >> 1) ^ ((y & 1u) ? MATRIX_A : 0u);
        }
        for (; kk < SPEC_MT_WORDS - 1; kk++) {
            y = (mt[kk] & UPPER_MASK) | (mt[kk + 1] & LOWER_MASK);
            mt[kk] = mt[kk + (MT_SHIFT - SPEC_MT_WORDS)] ^ (y >> 1) ^ ((y & 1u) ? MATRIX_A : 0u);
        }
        y = (mt[SPEC_MT_WORDS - 1] & UPPER_MASK) | (mt[0] & LOWER_MASK);
        mt[SPEC_MT_WORDS - 1] = mt[MT_SHIFT - 1] ^ (y >> 1) ^ ((y & 1u) ? MATRIX_A : 0u);
        s->pos = 0;
    }
    y = mt[s->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

double speculate_random(Speculate *s)
{
    const uint32_t a = next_word(s) >> 5, b = next_word(s) >> 6;
    return ((double)a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
}

int64_t speculate_accept(Speculate *s, int64_t drafts)
{
    const double u = speculate_random(s);
    int64_t a = 0;
    while (a < drafts && u < s->survival[a])
        a++;
    s->verifications++;
    s->drafted += drafts;
    s->accepted += a;
    return a;
}
