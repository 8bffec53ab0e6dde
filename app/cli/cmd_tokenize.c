/*
 * cmd_tokenize.c — `keel tokenize -m MODEL -p TEXT [--ids]`: token ids and
 * pieces (BOS/EOS as the vocabulary adds them).
 */
#include "cli.h"

#include <stdlib.h>

static const char *g_usage = "usage: keel tokenize -m MODEL (-p TEXT | -f FILE) [--ids] [--tokenizer F]";

int cmd_tokenize(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
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
        char piece[1024];
        for (int32_t i = 0; i < n; i++) {
            size_t pn = 0;
            if (keel_token_piece(m, ids[i], piece, sizeof piece, &pn) != KEEL_OK) pn = 0;
            printf("%6d -> '%.*s'\n", ids[i], (int)pn, piece);
        }
    }
    printf("%d tokens\n", n);
    free(ids);
    keel_model_close(m);
    return 0;
}
