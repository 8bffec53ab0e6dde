/*
 * cmd_tokenize.c — `keel tokenize -m MODEL -p TEXT [--ids]`: token ids and
 * pieces (BOS/EOS as the vocabulary adds them). Pieces come from the model
 * file and are printed with control characters escaped.
 */
#include "cli.h"

#include <stdlib.h>

static const char *g_usage =
    "usage: keel tokenize -m MODEL (-p TEXT | -f FILE | --prompt-ids 1,2,...) [--ids]\n"
    "Prints each token id and its piece (escaped), then the count.";

int cmd_tokenize(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.groups = CLI_G_MODEL | CLI_G_PROMPT | CLI_G_FILE | CLI_G_IDS;
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    keel_model *m = NULL;
    if ((rc = cli_open_model(&o, &m))) return rc;
    int32_t *ids = NULL, n = 0;
    if ((rc = cli_prompt_ids(&o, m, &ids, &n))) {
        keel_model_close(m);
        return rc;
    }
    if (o.ids_only) {
        putchar('[');
        for (int32_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
    } else {
        size_t cap = 256;
        char *piece = malloc(cap);
        if (!piece) rc = cli_fail("tokenize", KEEL_ENOMEM, NULL);
        for (int32_t i = 0; i < n && rc == 0; i++) {
            size_t pn = 0;
            keel_status st = keel_token_piece(m, ids[i], piece, cap, &pn);
            if (st == KEEL_ERANGE) { /* a long piece: grow to what it needs */
                char *np = realloc(piece, pn);
                if (np) {
                    piece = np;
                    cap = pn;
                    st = keel_token_piece(m, ids[i], piece, cap, &pn);
                } else {
                    st = KEEL_ENOMEM;
                }
            }
            if (st != KEEL_OK) {
                char d[64];
                snprintf(d, sizeof d, "token %d (id %d)", i, ids[i]);
                rc = cli_fail("piece", st, d);
                break;
            }
            printf("%6d -> '", ids[i]);
            cli_put_escaped(stdout, piece, pn);
            printf("'\n");
        }
        free(piece);
    }
    if (!rc) printf("%d tokens\n", n);
    free(ids);
    keel_model_close(m);
    return rc;
}
