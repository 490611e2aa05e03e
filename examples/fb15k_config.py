"""PyTorch-BigGraph's FB15k example config, in PBG's own Python format.

bigembed loads PBG configs unchanged: it runs this file (only because you named it on the
command line) and calls get_torchbiggraph_config(). The same settings in YAML are in
examples/fb15k237.yaml (adapted to FB15k-237). Paths are relative to the current directory.

Its edge_paths are the train, valid and test sets. PBG's example script (examples/fb15k.py)
imports all three, trains on the first only and evaluates on the test set, filtering with all
three; training on this config as it is would train on the test edges too (`bigembed train`
warns). The same steps with bigembed, run from the directory that holds PBG's data/FB15k/
(docs/pbg_compatibility.md):

  D=data/FB15k/freebase_mtr100_mte100
  bigembed import examples/fb15k_config.py $D-train.txt $D-valid.txt $D-test.txt
  bigembed train examples/fb15k_config.py -p edge_paths=$D-train_partitioned
  bigembed eval examples/fb15k_config.py --edges $D-test_partitioned

(eval filters with the config's edge_paths, all three, as PBG's script does.)
"""


def get_torchbiggraph_config():
    return dict(
        # I/O data
        entity_path="data/FB15k",
        edge_paths=[
            "data/FB15k/freebase_mtr100_mte100-train_partitioned",
            "data/FB15k/freebase_mtr100_mte100-valid_partitioned",
            "data/FB15k/freebase_mtr100_mte100-test_partitioned",
        ],
        checkpoint_path="model/fb15k",
        # Graph structure
        entities={"all": {"num_partitions": 1}},
        relations=[
            {
                "name": "all_edges",
                "lhs": "all",
                "rhs": "all",
                "operator": "complex_diagonal",
            }
        ],
        dynamic_relations=True,
        # Scoring model
        dimension=400,
        global_emb=False,
        comparator="dot",
        # Training
        num_epochs=50,
        num_uniform_negs=1000,
        loss_fn="softmax",
        lr=0.1,
        regularization_coef=1e-3,
        # Evaluation during training
        eval_fraction=0,  # to reproduce results, we need to use all training data
    )
