/*
 * hash.c — xxHash64 (libxxhash) and a small deterministic PRNG
 * (xoshiro256**, seeded through splitmix64) for tests, seeded sign
 * diagonals and generated models. Same seed, same stream, on every machine.
 */
#include "base.h"

#include <math.h>
#include <xxhash.h>

uint64_t base_hash64(const void *data, size_t n, uint64_t seed)
{
    return (uint64_t)XXH64(data, n, (XXH64_hash_t)seed);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void base_rng_seed(base_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t base_rng_next(base_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double base_rng_uniform(base_rng *r)
{
    return (double)(base_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

double base_rng_normal(base_rng *r)
{
    double u1 = base_rng_uniform(r);
    double u2 = base_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t base_rng_below(base_rng *r, uint64_t n)
{
    if (n == 0) return 0;
    /* Lemire's multiply-shift with rejection for exact uniformity. */
    unsigned __int128 m = (unsigned __int128)base_rng_next(r) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t t = (0 - n) % n;
        while (lo < t) {
            m = (unsigned __int128)base_rng_next(r) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}
