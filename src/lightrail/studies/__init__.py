"""Studies: experiments, cost comparisons and demos that combine the layers (collectives on fabrics, the
rails comparison and delay sweep, StragglAR in the model and for real, train-demo). They return results;
``report/`` writes files."""
