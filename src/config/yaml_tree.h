// A YAML document as a small tree (maps, sequences, scalars) in which every node keeps the
// file and line it came from, so config errors can point at the line. Parsed with libyaml's
// event API. Aliases, merge keys (<<) and multi-document files are rejected (no config needs them).
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef enum { YNODE_SCALAR = 0, YNODE_MAP, YNODE_SEQ } YNodeKind;

typedef struct YNode {
    YNodeKind kind;
    char *value;            // scalar text (NULL for maps and sequences)
    bool plain;             // unquoted scalar: `null`, `~` and an empty value mean null
    const char *origin;     // file name or "command line" (not owned: outlives the tree)
    int line;               // 1-based line in origin (0: command line)
    char **keys;            // map: keys[i] names items[i]
    struct YNode **items;   // map values or sequence elements
    int n, cap;
} YNode;

// Keys one mapping may have (a config's largest, OLMo's model section, has about 60).
#define YTREE_MAX_MAP_KEYS 10000

// Parses YAML text. An empty document gives an empty map. Errors: "origin:line: ...".
int ytree_parse(const char *text, size_t len, const char *origin, int line_offset, YNode **root);
void ytree_free(YNode *node);

bool ytree_is_null(const YNode *node);                 // plain null / ~ / empty scalar
YNode *ytree_map_get(const YNode *map, const char *key);
// Dotted path lookup ("spes_config.peer_id"); NULL when any part is missing.
YNode *ytree_get_path(const YNode *root, const char *path);
// Replaces (or adds) the node at a dotted path, creating maps on the way (line 0: they come
// from the command line); a mapping set over a mapping is merged into it (OmegaConf's merge).
// Takes ownership of value. Fails (message naming the path) when a part of the path is not a map.
int ytree_set_path(YNode *root, const char *path, YNode *value);
